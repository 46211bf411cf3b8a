# What `cmake --install` puts where, and the Debian package cpack builds from
# it (README "Installing"). Configure with -DCMAKE_INSTALL_PREFIX=/usr for a
# package: the systemd unit names the installed binary's path.
include(GNUInstallDirs)

# The unit in contrib/ names /usr/bin/ckptd (what the package installs); an
# install elsewhere gets its own path written in.
file(READ ${PROJECT_SOURCE_DIR}/contrib/ckptd@.service unit)
string(REPLACE "/usr/bin/ckptd" "${CMAKE_INSTALL_FULL_BINDIR}/ckptd" unit "${unit}")
string(REPLACE "file:///usr/share/doc/ckptd/" "file://${CMAKE_INSTALL_FULL_DOCDIR}/" unit "${unit}")
file(WRITE ${CMAKE_BINARY_DIR}/ckptd@.service "${unit}")
install(FILES ${CMAKE_BINARY_DIR}/ckptd@.service DESTINATION lib/systemd/system)

file(GLOB ck_docs ${PROJECT_SOURCE_DIR}/docs/*.md)
install(FILES README.md CONTRIBUTING.md ${ck_docs} DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(FILES contrib/README.md contrib/ckptd.example.yaml contrib/slack.json
              contrib/cron/ckptd.cron contrib/kubernetes/sidecar.yaml
        DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples)

# cpack -G DEB
set(CPACK_PACKAGE_NAME ckptd)
set(CPACK_PACKAGE_VENDOR "ckptd")
set(CPACK_PACKAGE_CONTACT "ckptd maintainers <ckptd@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "checkpoint agent beside training jobs: PMF metadata, deployment archives, uploads")
set(CPACK_PACKAGING_INSTALL_PREFIX ${CMAKE_INSTALL_PREFIX})
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION utils)
# The linked libraries come from dpkg-shlibdeps; the six ckptd loads on first
# use (lazy/) are not linked, so they are named here (Debian 12's names).
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS
    "libcurl4 (>= 7.88), libzip4, libarchive13, libhdf5-103-1, libsnappy1v5, libopenblas0, adduser")
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA ${PROJECT_SOURCE_DIR}/contrib/debian/postinst)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
include(CPack)

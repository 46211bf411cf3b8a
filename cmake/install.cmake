# What `cmake --install` puts where, and the Debian package cpack builds from
# it (docs/install.md). Configure with -DCMAKE_INSTALL_PREFIX=/usr for a
# package: the systemd unit names the installed binary's path.
include(GNUInstallDirs)

# The unit in contrib/ names /usr/bin/ckptd (what the package installs); an
# install elsewhere gets its own path written in.
file(READ ${PROJECT_SOURCE_DIR}/contrib/ckptd@.service unit)
string(REPLACE "/usr/bin/ckptd" "${CMAKE_INSTALL_FULL_BINDIR}/ckptd" unit "${unit}")
string(REPLACE "file:///usr/share/doc/ckptd/" "file://${CMAKE_INSTALL_FULL_DOCDIR}/" unit "${unit}")
file(WRITE ${CMAKE_BINARY_DIR}/ckptd@.service "${unit}")
install(FILES ${CMAKE_BINARY_DIR}/ckptd@.service DESTINATION lib/systemd/system)

# the man pages cmake/docs.cmake writes (gzip -9n, as Debian ships them)
if(TARGET gendocs)
  install(FILES ${CMAKE_BINARY_DIR}/gendocs/ckptd.1.gz ${CMAKE_BINARY_DIR}/gendocs/mldef.1.gz
          DESTINATION ${CMAKE_INSTALL_MANDIR}/man1)
  install(FILES ${CMAKE_BINARY_DIR}/gendocs/ckptd.yaml.5.gz DESTINATION ${CMAKE_INSTALL_MANDIR}/man5)
endif()

# /etc/ckptd: the environment of the unit and the cron example (secrets: 0640,
# the package's postinst gives it the group ckptd) and the example config;
# /var/log/ckptd and /var/lib/ckptd/textfile: what the cron example appends
# to and writes (the postinst makes them the user ckptd's)
install(FILES contrib/debian/ckptd.env DESTINATION ${CMAKE_INSTALL_FULL_SYSCONFDIR}/ckptd
        PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ)
install(FILES contrib/ckptd.example.yaml DESTINATION ${CMAKE_INSTALL_FULL_SYSCONFDIR}/ckptd)
install(DIRECTORY DESTINATION ${CMAKE_INSTALL_FULL_LOCALSTATEDIR}/log/ckptd)
install(DIRECTORY DESTINATION ${CMAKE_INSTALL_FULL_LOCALSTATEDIR}/lib/ckptd/textfile)

# Debian's copyright file and changelog (native package: changelog.gz); the
# changelog's newest entry must be the version being built
file(STRINGS ${PROJECT_SOURCE_DIR}/contrib/debian/changelog ck_chlog LIMIT_COUNT 1)
if(NOT ck_chlog MATCHES "^ckptd \\(${PROJECT_VERSION}\\) ")
  message(FATAL_ERROR "contrib/debian/changelog: its newest entry '${ck_chlog}' is not "
                      "version ${PROJECT_VERSION} (project() in CMakeLists.txt)")
endif()
find_program(CK_GZIP gzip REQUIRED)
add_custom_command(OUTPUT ${CMAKE_BINARY_DIR}/changelog.gz
  COMMAND ${CK_GZIP} -9nc ${PROJECT_SOURCE_DIR}/contrib/debian/changelog > ${CMAKE_BINARY_DIR}/changelog.gz
  DEPENDS ${PROJECT_SOURCE_DIR}/contrib/debian/changelog)
add_custom_target(debian_changelog ALL DEPENDS ${CMAKE_BINARY_DIR}/changelog.gz)
install(FILES contrib/debian/copyright ${CMAKE_BINARY_DIR}/changelog.gz
        DESTINATION ${CMAKE_INSTALL_DOCDIR})

file(GLOB ck_docs ${PROJECT_SOURCE_DIR}/docs/*.md)
install(FILES README.md CONTRIBUTING.md ${ck_docs} DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(FILES contrib/README.md contrib/ckptd.example.yaml contrib/slack.json
              contrib/cron/ckptd.cron contrib/kubernetes/sidecar.yaml
        DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples)

# cpack -G DEB
set(CPACK_PACKAGE_NAME ckptd)
set(CPACK_PACKAGE_VENDOR "ckptd")
set(CPACK_PACKAGE_CONTACT
    "Seed 855b83d2 maintainers <maintainers@users.noreply.a-seed-855b83d2.example>")
set(CPACK_DEBIAN_PACKAGE_MAINTAINER ${CPACK_PACKAGE_CONTACT})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "checkpoint agent beside training jobs")
# the extended description (cpack puts the summary above it)
set(CPACK_DEBIAN_PACKAGE_DESCRIPTION "ckptd runs beside a training job, as a systemd service, a cron job or a
Kubernetes sidecar. It registers every checkpoint the job writes, once it is
complete, in a PMF model tree (metadata.yaml with epoch, path, MD5 and the
training status), packs deployment archives (.mldef, SameDiff), verifies
them by running the network on the CPU, uploads to S3, HTTP/WebDAV, SFTP or a
path through a durable queue, and sends signed webhooks and exec hooks.
.
The package has ckptd, the archive tool mldef, the systemd template unit
ckptd@.service, the man pages and the reference documentation.")
set(CPACK_PACKAGING_INSTALL_PREFIX ${CMAKE_INSTALL_PREFIX})
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION utils)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
# installed binaries without their debug sections (lintian: unstripped-binary-or-object)
set(CPACK_STRIP_FILES ON)
# The linked libraries come from dpkg-shlibdeps; the six ckptd loads on first
# use (lazy/) are not linked, so they are named here (Debian 12's names).
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS
    "libcurl4 (>= 7.88), libzip4, libarchive13, libhdf5-103-1, libsnappy1v5, libopenblas0, adduser")
# /etc/ckptd's files are conffiles: an upgrade keeps what the admin changed
file(WRITE ${CMAKE_BINARY_DIR}/debian/conffiles
     "${CMAKE_INSTALL_FULL_SYSCONFDIR}/ckptd/ckptd.env\n"
     "${CMAKE_INSTALL_FULL_SYSCONFDIR}/ckptd/ckptd.example.yaml\n")
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
    ${PROJECT_SOURCE_DIR}/contrib/debian/postinst ${PROJECT_SOURCE_DIR}/contrib/debian/prerm
    ${PROJECT_SOURCE_DIR}/contrib/debian/postrm ${CMAKE_BINARY_DIR}/debian/conffiles)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
include(CPack)

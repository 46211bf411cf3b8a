# The man pages ckptd(1), mldef(1), ckptd.yaml(5) and the references
# docs/configuration.md and docs/commands.md, written after linking from what
# the binaries print (--help of each command, `ckptd config --keys`): the same
# tables as the command line and the config key table, so they cannot drift.
# tests/e2e/test_docs.py checks docs/ equals what the build wrote.
if(TARGET ckptd AND TARGET mldef)
  find_program(CK_PYTHON3 python3 REQUIRED)
  find_program(CK_GZIP gzip REQUIRED)
  set(ck_gen ${CMAKE_BINARY_DIR}/gendocs)
  set(ck_gen_out ${ck_gen}/ckptd.1 ${ck_gen}/mldef.1 ${ck_gen}/ckptd.yaml.5
                 ${ck_gen}/configuration.md ${ck_gen}/commands.md)
  # gzip -n: no name or time stamp in the header, so the package is reproducible
  add_custom_command(OUTPUT ${ck_gen_out} ${ck_gen}/ckptd.1.gz ${ck_gen}/mldef.1.gz
                            ${ck_gen}/ckptd.yaml.5.gz
    COMMAND ${CK_PYTHON3} ${PROJECT_SOURCE_DIR}/scripts/gendocs.py
            $<TARGET_FILE:ckptd> $<TARGET_FILE:mldef> ${ck_gen}
    COMMAND ${CK_GZIP} -9nkf ${ck_gen}/ckptd.1 ${ck_gen}/mldef.1 ${ck_gen}/ckptd.yaml.5
    DEPENDS ckptd mldef ${PROJECT_SOURCE_DIR}/scripts/gendocs.py
    COMMENT "man pages and docs/ references from the command and key tables"
    VERBATIM)
  add_custom_target(gendocs ALL DEPENDS ${ck_gen_out})
endif()

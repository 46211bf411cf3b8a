# Test helpers. Tests are named area.case and every one has a timeout.

# Stops configure when the file at path defines a test case (a line matching
# regex, the case's name its group-th group) that cases do not list: it would
# never run. Editing the file configures again.
function(ck_check_listed path regex group cases who)
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${path})
  file(STRINGS ${path} defs REGEX "${regex}")
  foreach(def IN LISTS defs)
    string(REGEX REPLACE "${regex}" "\\${group}" case "${def}")
    if(NOT case IN_LIST cases)
      message(FATAL_ERROR "${path} defines the test case '${case}', which the CASES of ${who} do not list")
    endif()
  endforeach()
endfunction()

# ck_unit_test(area SOURCES file.c LIBS lib... CASES a b c): a cmocka test
# executable whose cases are registered one by one (the binary runs one case
# when given its name). A case its sources define but CASES does not list is a
# configure error: such a case would never run.
function(ck_unit_test area)
  cmake_parse_arguments(T "" "" "SOURCES;LIBS;CASES" ${ARGN})
  foreach(src IN LISTS T_SOURCES)
    ck_check_listed(${CMAKE_CURRENT_SOURCE_DIR}/${src}
      ".*cmocka_unit_test(_setup_teardown)?\\(([a-z_0-9]+).*" 2 "${T_CASES}" "ck_unit_test(${area})")
  endforeach()
  add_executable(test_${area} ${T_SOURCES})
  target_link_libraries(test_${area} PRIVATE ${T_LIBS} PkgConfig::CMOCKA ck_options)
  foreach(case IN LISTS T_CASES)
    add_test(NAME ${area}.${case} COMMAND test_${area} ${case})
    set_tests_properties(${area}.${case} PROPERTIES TIMEOUT 60
      ENVIRONMENT "CK_TEST_TMP=${CMAKE_BINARY_DIR}/tmp;CK_SHARED_DATA=${PROJECT_SOURCE_DIR}/../shared/data")
  endforeach()
endfunction()

# ck_e2e_test(area SCRIPT tests/e2e/x.py CASES a b c [TIMEOUT s]): end-to-end
# cases of the real binary, written with Python's unittest; each case is one test.
function(ck_e2e_test area)
  cmake_parse_arguments(T "" "SCRIPT;TIMEOUT;CLASS;FIXTURES" "CASES;LABELS" ${ARGN})
  # for ck_e2e_check_listed: every script and the cases listed for it
  set_property(GLOBAL APPEND PROPERTY CK_E2E_SCRIPTS ${T_SCRIPT})
  set_property(GLOBAL APPEND PROPERTY CK_E2E_CASES_${T_SCRIPT} ${T_CASES})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 120)
  endif()
  foreach(case IN LISTS T_CASES)
    add_test(NAME ${area}.${case}
      COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/${T_SCRIPT} -v ${T_CLASS}.test_${case})
    set_tests_properties(${area}.${case} PROPERTIES TIMEOUT ${T_TIMEOUT}
      LABELS "e2e;${T_LABELS}"
      ENVIRONMENT "CKPTD=$<TARGET_FILE:ckptd>;CK_TEST_TMP=${CMAKE_BINARY_DIR}/tmp;CK_SHARED_DATA=${PROJECT_SOURCE_DIR}/../shared/data;CK_RGW_DIR=${CMAKE_BINARY_DIR}/rgw;PYTHONDONTWRITEBYTECODE=1")
    if(T_FIXTURES)
      set_tests_properties(${area}.${case} PROPERTIES FIXTURES_REQUIRED ${T_FIXTURES})
    endif()
  endforeach()
endfunction()

# After the last ck_e2e_test: a test_ method of a script that no ck_e2e_test
# lists (for any of its classes) is a configure error: it would never run.
function(ck_e2e_check_listed)
  get_property(scripts GLOBAL PROPERTY CK_E2E_SCRIPTS)
  list(REMOVE_DUPLICATES scripts)
  foreach(script IN LISTS scripts)
    get_property(cases GLOBAL PROPERTY CK_E2E_CASES_${script})
    ck_check_listed(${PROJECT_SOURCE_DIR}/${script} "^    def test_([a-z_0-9]+)\\(.*" 1 "${cases}"
      "any ck_e2e_test of it")
  endforeach()
endfunction()

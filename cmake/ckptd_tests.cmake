# Test helpers. Tests are named area.case and every one has a timeout.

# ck_unit_test(area SOURCE file.c LIBS lib...): a cmocka test executable whose
# cases are registered one by one (the binary runs one case when given its name).
function(ck_unit_test area)
  cmake_parse_arguments(T "" "" "SOURCES;LIBS;CASES" ${ARGN})
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
  cmake_parse_arguments(T "" "SCRIPT;TIMEOUT;CLASS" "CASES;LABELS" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 120)
  endif()
  foreach(case IN LISTS T_CASES)
    add_test(NAME ${area}.${case}
      COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/${T_SCRIPT} -v ${T_CLASS}.test_${case})
    set_tests_properties(${area}.${case} PROPERTIES TIMEOUT ${T_TIMEOUT}
      LABELS "e2e;${T_LABELS}"
      ENVIRONMENT "CKPTD=$<TARGET_FILE:ckptd>;CK_TEST_TMP=${CMAKE_BINARY_DIR}/tmp;CK_SHARED_DATA=${PROJECT_SOURCE_DIR}/../shared/data;PYTHONDONTWRITEBYTECODE=1")
  endforeach()
endfunction()

# Run after a Catch2 test binary links: every test case name must select exactly that test case when ctest
# passes it back as a filter. A name that CMake splits (a ';') or that Catch2 reads as a pattern would
# otherwise become a ctest entry that runs nothing and passes.
#   cmake -D TEST_EXECUTABLE=path -P check_test_names.cmake
execute_process(COMMAND "${TEST_EXECUTABLE}" --list-test-names-only
  OUTPUT_VARIABLE listing RESULT_VARIABLE listed)
if(listed LESS 1)
  message(FATAL_ERROR "${TEST_EXECUTABLE} lists no test cases")
endif()
string(FIND "${listing}" ";" semicolon)
if(NOT semicolon EQUAL -1)
  string(SUBSTRING "${listing}" 0 ${semicolon} before)
  string(REGEX REPLACE ".*\n" "" start "${before}")
  message(FATAL_ERROR "${TEST_EXECUTABLE}: the test case name starting \"${start};\" contains ';', which CMake "
                      "splits into two ctest entries that match nothing. Rename it.")
endif()
string(REPLACE "\n" ";" names "${listing}")
foreach(name IN LISTS names)
  if(name STREQUAL "")
    continue()
  endif()
  # The same escaping catch_discover_tests applies (CatchAddTests.cmake).
  set(filter "${name}")
  foreach(char , [ ])
    string(REPLACE "${char}" "\\${char}" filter "${filter}")
  endforeach()
  execute_process(COMMAND "${TEST_EXECUTABLE}" "${filter}" --list-test-names-only OUTPUT_VARIABLE selected)
  if(NOT selected STREQUAL "${name}\n")
    message(FATAL_ERROR "${TEST_EXECUTABLE}: the ctest entry for \"${name}\" would select "
                        "[${selected}] instead of exactly that test case. Rename it.")
  endif()
endforeach()

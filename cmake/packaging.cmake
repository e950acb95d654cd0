# Installation and the Debian package (issue 37), and the tests of how the project is set up and
# shipped. Included by CMakeLists.txt.

if(BACKPROP_BUILD_TESTS)
  # setup.sh builds backprop alone for the first run and everything for the tests (< 1 s).
  add_test(NAME setup_builds_what_is_needed COMMAND bash ${CMAKE_SOURCE_DIR}/tests/package/setup_targets_test.sh)
  set_tests_properties(setup_builds_what_is_needed PROPERTIES LABELS package)
endif()

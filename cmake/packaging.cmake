# Installation and the Debian package (issue 37). Included by CMakeLists.txt.
#   cmake --build build --target deb     -> build/backpropagate_<version>_<arch>.deb (builds backprop first)
#   cmake --build build --target package -> the same from backprop as it is (CMake's own target; CPack's
#                                           step that would build every target first, tests and
#                                           benchmarks included, is off: CMAKE_SKIP_INSTALL_ALL_DEPENDENCY)
#   dpkg -i build/backpropagate_*.deb    -> /usr/bin/backprop, /usr/share/backpropagate, /usr/share/doc/backpropagate,
#                                           /usr/lib/python3/dist-packages/backpropagate (where it was built)
# The layout under the prefix:
#   bin/backprop
#   share/backpropagate/models/tiny-chat, share/backpropagate/examples
#       the demo model and the quick start's data: `backprop train` with no arguments looks for them
#       in ../share/backpropagate next to the executable when neither the working folder nor a folder
#       above the executable holds models/ and examples/ (src/cli/train_quickstart.cpp, find_root)
#   share/doc/backpropagate/README.md, share/doc/backpropagate/docs/*.md (the README's links hold)
# tests/package/package_test.sh builds the package, unpacks it and runs it (ctest label `package`).

# The package holds backprop alone: packaging (and `install`) must not build the tests (minutes).
set(CMAKE_SKIP_INSTALL_ALL_DEPENDENCY ON)
set(BP_SHARE_DIR share/backpropagate)  # src/cli/train_quickstart.cpp knows this name
set(BP_DOC_DIR share/doc/backpropagate)

install(TARGETS backprop RUNTIME DESTINATION bin)
install(DIRECTORY ${CMAKE_SOURCE_DIR}/models/tiny-chat DESTINATION ${BP_SHARE_DIR}/models)
install(FILES ${CMAKE_SOURCE_DIR}/models/README.md DESTINATION ${BP_SHARE_DIR}/models)
install(DIRECTORY ${CMAKE_SOURCE_DIR}/examples/ DESTINATION ${BP_SHARE_DIR}/examples)
install(FILES ${CMAKE_SOURCE_DIR}/README.md DESTINATION ${BP_DOC_DIR})
install(DIRECTORY ${CMAKE_SOURCE_DIR}/docs/ DESTINATION ${BP_DOC_DIR}/docs FILES_MATCHING PATTERN "*.md")
# The Python package (build/python/backpropagate: the .py files and the extension module, built for
# Debian's python3) where /usr/bin/python3 finds it; pip installs it too (pyproject.toml, README "Python").
set(BP_DEB_DEPENDS "")
if(BP_HAVE_PYTHON)
  install(DIRECTORY ${CMAKE_BINARY_DIR}/python/backpropagate DESTINATION lib/python3/dist-packages
          PATTERN "__pycache__" EXCLUDE)
  list(APPEND BP_DEB_DEPENDS python3)
endif()

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME backpropagate)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "fine-tune Llama-family language models on the machine you have")
set(CPACK_PACKAGE_DESCRIPTION
    "backprop fine-tunes Llama-family models (LoRA or full fine-tuning) on the CPU, from a JSONL file of "
    "conversations to a PEFT adapter, a merged model, a GGUF file and an Ollama model. Includes the demo "
    "model tiny-chat and the quick start's data: `backprop train` with no arguments fine-tunes it.")
set(CPACK_PACKAGE_CONTACT "backpropagate maintainers <maintainers@users.noreply.a-seed-13c89443.example>")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)  # backpropagate_<version>_<arch>.deb
set(CPACK_DEBIAN_PACKAGE_SECTION science)
# Depends from the libraries backprop links (dpkg-shlibdeps): OpenBLAS's OpenMP build (the RUNPATH
# names its folder), libgomp, ICU, PCRE2, OpenSSL's libcrypto, fmt, spdlog, libstdc++, glibc. A CUDA
# build also links the CUDA toolkit's libcudart and libcublas, which no Debian package provides here
# (/usr/local/cuda): they get no Depends, and the machine that installs such a package needs that
# toolkit's libraries on the loader's path (configure with -DBACKPROP_CUDA=OFF for a CPU-only package).
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# dpkg-shlibdeps names libopenblas0, which any of Debian's OpenBLAS builds satisfies; the RUNPATH asks
# for the OpenMP build (see CMakeLists.txt: the pthread build's threads fight OpenMP's), so name it.
if(BP_BLAS_TARGET STREQUAL "bp_openblas")
  list(APPEND BP_DEB_DEPENDS libopenblas0-openmp)
endif()
list(JOIN BP_DEB_DEPENDS ", " CPACK_DEBIAN_PACKAGE_DEPENDS)
include(CPack)

add_custom_target(deb COMMAND ${CMAKE_CPACK_COMMAND} -G DEB --config ${CMAKE_BINARY_DIR}/CPackConfig.cmake
                  WORKING_DIRECTORY ${CMAKE_BINARY_DIR} COMMENT "Debian package of backprop" VERBATIM)
add_dependencies(deb backprop)
if(BP_HAVE_PYTHON)
  add_dependencies(deb python_package)
endif()

if(BACKPROP_BUILD_TESTS)
  # setup.sh builds backprop alone for the first run and everything for the tests (seconds); the package
  # installs into a scratch root and runs `backprop info` and a short quick start there.
  add_test(NAME setup_builds_what_is_needed COMMAND bash ${CMAKE_SOURCE_DIR}/tests/package/setup_targets_test.sh)
  add_test(NAME deb_package_installs_and_runs
           COMMAND bash ${CMAKE_SOURCE_DIR}/tests/package/package_test.sh ${CMAKE_BINARY_DIR})
  set_tests_properties(setup_builds_what_is_needed deb_package_installs_and_runs PROPERTIES LABELS package)
endif()

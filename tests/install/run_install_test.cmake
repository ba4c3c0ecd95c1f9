# Installs ferrum into WORK_DIR/prefix, then configures, builds and runs
# tests/install/consumer against it, as an engine would.
#
# FERRUM_INSTALL_TEST_MODE:
#   build_tree (default): installs the already-built tree FERRUM_BUILD_DIR.
#   shared: adds FERRUM_SOURCE_DIR to tests/install/superbuild (a parent
#     project, as an engine vendoring the source tree would: add_subdirectory
#     or FetchContent) as a shared library, with FERRUM_INNER_CACHE (an
#     initial cache file: the outer build's toolchain and the dependencies it
#     found, tests/CMakeLists.txt). A configure without a build type first
#     checks that ferrum leaves the parent's alone, and one for compute
#     capability 7.5 that it refuses by name (a FERRUM_CUDA build only). Then builds the superbuild
#     with FERRUM_BUILD_JOBS jobs, runs its in-tree consumer, installs it
#     (ferrum's install rules, through the parent), and checks with FERRUM_NM
#     that the library exports nothing of fmt's.
#   cpu_only: configures FERRUM_SOURCE_DIR at top level with FERRUM_CUDA=OFF
#     and no CUDA toolkit in reach (none on PATH, CUDAToolkit_ROOT and the
#     CUDA compiler pointing nowhere), with FERRUM_INNER_CACHE (the outer
#     build's C++ toolchain only); builds the library, the CPU test binary and
#     the engine; runs the CPU tests (FERRUM_CPU_ONLY_GTEST_FILTER), the
#     README's main command on the tiny model, and checks that neither
#     program loads a CUDA library; then installs and consumes it as above.
#     With FERRUM_CPU_ONLY_TESTS=OFF the CPU test binary is neither built nor
#     run (a build with another compiler, whose standard library may lack
#     what the tests use: Clang 14 has no std::source_location on
#     libstdc++); FERRUM_CONSUMER_CXX then also builds the consumer, so the
#     installed headers are compiled by that compiler too.
if(NOT DEFINED FERRUM_INSTALL_TEST_MODE)
  set(FERRUM_INSTALL_TEST_MODE build_tree)
endif()

function(ferrum_run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc})")
  endif()
endfunction()

# Runs a command that must fail, with `needle` in its output.
function(ferrum_run_expect_failure what needle)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(rc EQUAL 0)
    message(FATAL_ERROR "${what} succeeded; it must fail")
  endif()
  string(REGEX REPLACE "[ \t\r\n]+" " " flat "${out}")  # CMake wraps its messages
  string(FIND "${flat}" "${needle}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "${what} failed without naming '${needle}':\n${out}")
  endif()
endfunction()

# The one program `name` built under `dir` (a multi-config generator puts it
# in a configuration's folder).
function(ferrum_find_program out dir name)
  file(GLOB_RECURSE found ${dir}/${name} ${dir}/${name}.exe)
  list(LENGTH found count)
  if(NOT count EQUAL 1)
    message(FATAL_ERROR "expected one ${name} under ${dir}, found: ${found}")
  endif()
  set(${out} ${found} PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE ${WORK_DIR})

if(FERRUM_INSTALL_TEST_MODE STREQUAL "build_tree")
  set(ferrum_lib_build ${FERRUM_BUILD_DIR})
elseif(FERRUM_INSTALL_TEST_MODE STREQUAL "shared")
  set(ferrum_lib_build ${WORK_DIR}/superbuild)
  if(NOT FERRUM_BUILD_JOBS)
    set(FERRUM_BUILD_JOBS 1)
  endif()
  set(ferrum_inner_cache_args "")
  if(FERRUM_INNER_CACHE)  # run by hand without it: this build finds its own
    set(ferrum_inner_cache_args -C ${FERRUM_INNER_CACHE})
  endif()
  get_filename_component(ferrum_superbuild_dir ${CONSUMER_SOURCE_DIR}/../superbuild ABSOLUTE)
  # CMake (3.22+) takes a CMAKE_BUILD_TYPE from the environment as the default.
  unset(ENV{CMAKE_BUILD_TYPE})
  ferrum_run("configuring the superbuild without a build type (ferrum must not set the parent's)"
    ${CMAKE_COMMAND} -S ${ferrum_superbuild_dir} -B ${WORK_DIR}/superbuild-check -G ${CMAKE_GENERATOR}
    ${ferrum_inner_cache_args} -UCMAKE_BUILD_TYPE
    -DFERRUM_SOURCE_DIR=${FERRUM_SOURCE_DIR} -DSUPERBUILD_CONFIGURE_ONLY=ON)
  if(FERRUM_CUDA)
    ferrum_run_expect_failure("configuring the superbuild for compute capability 7.5"
      "CMAKE_CUDA_ARCHITECTURES is '75'"
      ${CMAKE_COMMAND} -S ${ferrum_superbuild_dir} -B ${WORK_DIR}/superbuild-sm75 -G ${CMAKE_GENERATOR}
      ${ferrum_inner_cache_args}
      -DFERRUM_SOURCE_DIR=${FERRUM_SOURCE_DIR} -DSUPERBUILD_CONFIGURE_ONLY=ON -DCMAKE_CUDA_ARCHITECTURES=75)
  endif()
  ferrum_run("configuring the superbuild (ferrum as a shared subproject)"
    ${CMAKE_COMMAND} -S ${ferrum_superbuild_dir} -B ${ferrum_lib_build} -G ${CMAKE_GENERATOR}
    ${ferrum_inner_cache_args}
    -DFERRUM_SOURCE_DIR=${FERRUM_SOURCE_DIR} -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON)
  ferrum_run("building the superbuild"
    ${CMAKE_COMMAND} --build ${ferrum_lib_build} --config Release --parallel ${FERRUM_BUILD_JOBS})
  ferrum_find_program(ferrum_in_tree_consumer ${ferrum_lib_build} ferrum_consumer_in_tree)
  ferrum_run("the superbuild's consumer (ferrum::kernels in the build tree)" ${ferrum_in_tree_consumer})
  set(ferrum_install_config --config Release)  # for a multi-config generator
elseif(FERRUM_INSTALL_TEST_MODE STREQUAL "cpu_only")
  set(ferrum_lib_build ${WORK_DIR}/cpu-only)
  if(NOT FERRUM_BUILD_JOBS)
    set(FERRUM_BUILD_JOBS 1)
  endif()
  # No nvcc on PATH for the configure and the build (they inherit this
  # environment).
  set(ferrum_path "$ENV{PATH}")
  string(REPLACE ":" ";" ferrum_path "${ferrum_path}")
  list(FILTER ferrum_path EXCLUDE REGEX "[Cc][Uu][Dd][Aa]")
  list(JOIN ferrum_path ":" ferrum_path)
  set(ENV{PATH} "${ferrum_path}")
  unset(ENV{CUDACXX})
  unset(ENV{CUDA_PATH})
  set(ferrum_inner_cache_args "")
  if(FERRUM_INNER_CACHE)
    set(ferrum_inner_cache_args -C ${FERRUM_INNER_CACHE})
  endif()
  ferrum_run("configuring the CPU-only build (FERRUM_CUDA=OFF)"
    ${CMAKE_COMMAND} -S ${FERRUM_SOURCE_DIR} -B ${ferrum_lib_build} -G ${CMAKE_GENERATOR}
    ${ferrum_inner_cache_args} -DCMAKE_BUILD_TYPE=Release -DFERRUM_CUDA=OFF
    -DCMAKE_CUDA_COMPILER=${WORK_DIR}/no-nvcc -DCUDAToolkit_ROOT=${WORK_DIR}/no-cuda
    -DFERRUM_BUILD_TESTS=ON -DFERRUM_BUILD_APPS=ON -DFERRUM_BUILD_BENCHMARKS=OFF)
  if(NOT DEFINED FERRUM_CPU_ONLY_TESTS)
    set(FERRUM_CPU_ONLY_TESTS ON)
  endif()
  set(ferrum_cpu_only_targets ferrum_engine)
  if(FERRUM_CPU_ONLY_TESTS)
    list(APPEND ferrum_cpu_only_targets ferrum_tests_cpu)
  endif()
  ferrum_run("building the CPU-only library and ${ferrum_cpu_only_targets}"
    ${CMAKE_COMMAND} --build ${ferrum_lib_build} --config Release --parallel ${FERRUM_BUILD_JOBS}
    --target ${ferrum_cpu_only_targets})
  ferrum_find_program(ferrum_engine ${ferrum_lib_build} ferrum_engine)
  set(ferrum_cpu_tests "")
  if(FERRUM_CPU_ONLY_TESTS)
    ferrum_find_program(ferrum_cpu_tests ${ferrum_lib_build} ferrum_tests_cpu)
    ferrum_run("the CPU tests of the CPU-only build" ${ferrum_cpu_tests} --gtest_brief=1
      "--gtest_filter=${FERRUM_CPU_ONLY_GTEST_FILTER}")
  endif()
  execute_process(COMMAND ${ferrum_engine} --random tiny-qwen3 --prompt-tokens 1,2,3 --steps 8
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0 OR NOT out MATCHES "backend cpu ")
    message(FATAL_ERROR "the CPU-only engine (tiny-qwen3, 8 steps) failed (${rc}) or named no CPU backend:\n${out}")
  endif()
  message(STATUS "the CPU-only engine:\n${out}")
  find_program(ferrum_ldd ldd)
  if(ferrum_ldd)
    foreach(ferrum_program IN ITEMS ${ferrum_cpu_tests} ${ferrum_engine})
      execute_process(COMMAND ${ferrum_ldd} ${ferrum_program} OUTPUT_VARIABLE out ERROR_VARIABLE out)
      if(out MATCHES "lib(cuda|cudart|cublas|cublasLt|nccl|nvrtc)[.]so")
        message(FATAL_ERROR "${ferrum_program} of the CPU-only build loads a CUDA library:\n${out}")
      endif()
    endforeach()
  endif()
  set(ferrum_install_config --config Release)
else()
  message(FATAL_ERROR "FERRUM_INSTALL_TEST_MODE is '${FERRUM_INSTALL_TEST_MODE}': build_tree, shared or cpu_only")
endif()

ferrum_run("cmake --install" ${CMAKE_COMMAND} --install ${ferrum_lib_build} --prefix ${WORK_DIR}/prefix
           ${ferrum_install_config})

if(FERRUM_INSTALL_TEST_MODE STREQUAL "shared")
  # fmt is compiled into the library privately; its symbols must not be
  # exported, where they could interpose on a consumer's own fmt
  # (cmake/ferrum_exports.map). Judged by the mangled names: a symbol of
  # fmt's own is _ZN3fmt..., _ZTVN3fmt... (vtable) and so on, while ferrum's
  # functions taking fmt types (ferrum::detail::fail<...>) mention fmt only
  # in their signature and cannot clash with another fmt.
  file(GLOB_RECURSE ferrum_installed_so ${WORK_DIR}/prefix/libferrum_kernels.so)
  list(LENGTH ferrum_installed_so ferrum_so_count)
  if(NOT ferrum_so_count EQUAL 1)
    message(FATAL_ERROR "expected one libferrum_kernels.so under ${WORK_DIR}/prefix, found: ${ferrum_installed_so}")
  endif()
  if(NOT FERRUM_NM)
    message(STATUS "no nm (CMAKE_NM is empty): the exported-symbol check is skipped")
  else()
    execute_process(COMMAND ${FERRUM_NM} -D --defined-only ${ferrum_installed_so}
                    RESULT_VARIABLE rc OUTPUT_VARIABLE ferrum_symbols)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "${FERRUM_NM} -D failed (${rc})")
    endif()
    string(REGEX MATCHALL "[^\n]+" ferrum_symbols "${ferrum_symbols}")
    set(ferrum_fmt_symbols "")
    foreach(ferrum_line IN LISTS ferrum_symbols)
      # _Z, then an optional special-name prefix (vtable, typeinfo, guard
      # variable, thunk, function-local static), then a nested name in fmt.
      # (_ZN3fmt, _ZTVN3fmt, _ZZN3fmt (a function's local static),
      # _ZGVZN3fmt (its guard variable), ...)
      if(ferrum_line MATCHES " _Z(GV|T[VTISHW]|T[hv][0-9n_]+)?Z?N[rVKRO]*3fmt")
        list(APPEND ferrum_fmt_symbols "${ferrum_line}")
      endif()
    endforeach()
    list(LENGTH ferrum_symbols ferrum_symbol_count)
    list(LENGTH ferrum_fmt_symbols ferrum_fmt_count)
    if(ferrum_fmt_count GREATER 0)
      list(JOIN ferrum_fmt_symbols "\n" ferrum_fmt_symbols)
      message(FATAL_ERROR "${ferrum_installed_so} exports ${ferrum_fmt_count} symbol(s) of fmt "
                          "(nm -DC shows them demangled):\n${ferrum_fmt_symbols}")
    endif()
    message(STATUS "${ferrum_installed_so}: ${ferrum_symbol_count} exported symbols, none of fmt")
  endif()
endif()

set(ferrum_consumer_args "")
if(FERRUM_CONSUMER_CXX)
  set(ferrum_consumer_args -DCMAKE_CXX_COMPILER=${FERRUM_CONSUMER_CXX})
endif()
ferrum_run("configuring the consumer"
  ${CMAKE_COMMAND} -S ${CONSUMER_SOURCE_DIR} -B ${WORK_DIR}/build -G ${CMAKE_GENERATOR}
  -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix ${ferrum_consumer_args})
ferrum_run("building the consumer" ${CMAKE_COMMAND} --build ${WORK_DIR}/build --config Release)
ferrum_find_program(ferrum_consumer ${WORK_DIR}/build ferrum_consumer)
ferrum_run("the consumer" ${ferrum_consumer})

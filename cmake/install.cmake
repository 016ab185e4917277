# Installs a built simjoin into a prefix so that find_package(simjoin) finds it:
#   cargo build --release
#   cmake -DPREFIX=/usr/local [-DLIB_DIR=target/release] -P cmake/install.cmake
# Layout: PREFIX/include/{simjoin.h,simjoin.hpp}, PREFIX/lib/libsimjoin.{so,a},
# PREFIX/lib/cmake/simjoin/simjoin{Config,ConfigVersion}.cmake, PREFIX/lib/pkgconfig/simjoin.pc
# (`pkg-config --cflags --libs simjoin`; `--static` adds the system libraries libsimjoin.a needs).
cmake_minimum_required(VERSION 3.16)
get_filename_component(_root "${CMAKE_CURRENT_LIST_DIR}/.." ABSOLUTE)
if(NOT DEFINED PREFIX)
  message(FATAL_ERROR "usage: cmake -DPREFIX=<dir> [-DLIB_DIR=<cargo output dir>] -P cmake/install.cmake")
endif()
if(NOT DEFINED LIB_DIR)
  set(LIB_DIR "${_root}/target/release")
endif()
get_filename_component(PREFIX "${PREFIX}" ABSOLUTE)
get_filename_component(LIB_DIR "${LIB_DIR}" ABSOLUTE)
foreach(_lib libsimjoin.so libsimjoin.a)
  if(NOT EXISTS "${LIB_DIR}/${_lib}")
    message(FATAL_ERROR "${LIB_DIR}/${_lib} not found: run `cargo build --release` first")
  endif()
endforeach()

# The version comes from the generated header, which tests/header.rs keeps equal to Cargo.toml.
file(STRINGS "${_root}/include/simjoin.h" _line REGEX "^#define SIMJOIN_VERSION_STRING ")
string(REGEX REPLACE ".*\"(.*)\".*" "\\1" SIMJOIN_VERSION "${_line}")

# The shared library's SONAME is libsimjoin.so.<ABI version> (build.rs): install it under
# that name, with the usual development symlink libsimjoin.so -> libsimjoin.so.<ABI>.
file(STRINGS "${_root}/include/simjoin.h" _abi REGEX "^#define SIMJOIN_ABI_VERSION ")
string(REGEX REPLACE ".*SIMJOIN_ABI_VERSION ([0-9]+).*" "\\1" SIMJOIN_ABI_VERSION "${_abi}")

file(INSTALL "${_root}/include/simjoin.h" "${_root}/bindings/cpp/simjoin.hpp"
     DESTINATION "${PREFIX}/include")
file(INSTALL "${LIB_DIR}/libsimjoin.a" DESTINATION "${PREFIX}/lib")
file(REMOVE "${PREFIX}/lib/libsimjoin.so" "${PREFIX}/lib/libsimjoin.so.${SIMJOIN_ABI_VERSION}")
file(COPY_FILE "${LIB_DIR}/libsimjoin.so" "${PREFIX}/lib/libsimjoin.so.${SIMJOIN_ABI_VERSION}")
file(CREATE_LINK "libsimjoin.so.${SIMJOIN_ABI_VERSION}" "${PREFIX}/lib/libsimjoin.so" SYMBOLIC)
file(INSTALL "${CMAKE_CURRENT_LIST_DIR}/simjoinConfig.cmake" DESTINATION "${PREFIX}/lib/cmake/simjoin")
include(CMakePackageConfigHelpers)
write_basic_package_version_file("${PREFIX}/lib/cmake/simjoin/simjoinConfigVersion.cmake"
  VERSION "${SIMJOIN_VERSION}" COMPATIBILITY SameMinorVersion)
# pkg-config file, for builds without CMake (the database extensions in bindings/ use it).
file(WRITE "${PREFIX}/lib/pkgconfig/simjoin.pc"
"prefix=${PREFIX}
libdir=\${prefix}/lib
includedir=\${prefix}/include

Name: simjoin
Description: Exact similarity (eps-distance) joins on a Vulkan GPU or the CPU
Version: ${SIMJOIN_VERSION}
Cflags: -I\${includedir}
Libs: -L\${libdir} -lsimjoin
Libs.private: -ldl -lgcc_s -lutil -lrt -lpthread -lm -ldl -lc
")
message(STATUS "simjoin ${SIMJOIN_VERSION} (C ABI ${SIMJOIN_ABI_VERSION}) installed in ${PREFIX}")

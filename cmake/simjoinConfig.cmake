# CMake package config for simjoin: `find_package(simjoin CONFIG REQUIRED)` then link
# `simjoin::simjoin`. Installed as <prefix>/lib/cmake/simjoin/simjoinConfig.cmake by
# cmake/install.cmake, next to <prefix>/lib/libsimjoin.{so,a} and <prefix>/include/simjoin.h.
#
# Targets:
#   simjoin::simjoin_shared  the shared library (libsimjoin.so.<ABI>, SONAME libsimjoin.so.<ABI>)
#   simjoin::simjoin_static  the static library (libsimjoin.a) with the system libraries
#                            the Rust standard library needs
#   simjoin::simjoin         simjoin_static when simjoin_USE_STATIC_LIBS is ON, else
#                            simjoin_shared
# The C++ RAII wrapper (simjoin.hpp) is in the same include directory.

get_filename_component(_simjoin_prefix "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
file(STRINGS "${_simjoin_prefix}/include/simjoin.h" _simjoin_abi REGEX "^#define SIMJOIN_ABI_VERSION ")
string(REGEX REPLACE ".*SIMJOIN_ABI_VERSION ([0-9]+).*" "\\1" SIMJOIN_ABI_VERSION "${_simjoin_abi}")

# What `cargo rustc --lib --crate-type staticlib -- --print native-static-libs` prints
# (checked by tests/check-static-libs.sh). The same link line is documented in docs/c.md.
set(SIMJOIN_NATIVE_STATIC_LIBS -ldl -lgcc_s -lutil -lrt -lpthread -lm -ldl -lc)

if(NOT TARGET simjoin::simjoin_shared)
  add_library(simjoin::simjoin_shared SHARED IMPORTED)
  set_target_properties(simjoin::simjoin_shared PROPERTIES
    IMPORTED_LOCATION "${_simjoin_prefix}/lib/libsimjoin.so.${SIMJOIN_ABI_VERSION}"
    # Executables record the SONAME, so a library of another ABI version is never loaded.
    IMPORTED_SONAME "libsimjoin.so.${SIMJOIN_ABI_VERSION}"
    INTERFACE_INCLUDE_DIRECTORIES "${_simjoin_prefix}/include")

  add_library(simjoin::simjoin_static STATIC IMPORTED)
  set_target_properties(simjoin::simjoin_static PROPERTIES
    IMPORTED_LOCATION "${_simjoin_prefix}/lib/libsimjoin.a"
    IMPORTED_LINK_INTERFACE_LANGUAGES C
    INTERFACE_INCLUDE_DIRECTORIES "${_simjoin_prefix}/include"
    INTERFACE_LINK_LIBRARIES "${SIMJOIN_NATIVE_STATIC_LIBS}")

  add_library(simjoin::simjoin INTERFACE IMPORTED)
  if(simjoin_USE_STATIC_LIBS)
    set_target_properties(simjoin::simjoin PROPERTIES INTERFACE_LINK_LIBRARIES simjoin::simjoin_static)
  else()
    set_target_properties(simjoin::simjoin PROPERTIES INTERFACE_LINK_LIBRARIES simjoin::simjoin_shared)
  endif()
endif()

foreach(_simjoin_file "${_simjoin_prefix}/include/simjoin.h"
        "${_simjoin_prefix}/lib/libsimjoin.so.${SIMJOIN_ABI_VERSION}"
        "${_simjoin_prefix}/lib/libsimjoin.a")
  if(NOT EXISTS "${_simjoin_file}")
    set(simjoin_FOUND FALSE)
    set(simjoin_NOT_FOUND_MESSAGE "simjoin package is incomplete: ${_simjoin_file} is missing")
  endif()
endforeach()
unset(_simjoin_file)
unset(_simjoin_abi)
unset(_simjoin_prefix)

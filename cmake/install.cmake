# cmake/install.cmake - what `cmake --install` puts on a system for C users: the shared
# and static library, include/vramkit.h and vramkit_record.h, the vramkit command, a CMake package
# (find_package(vramkit) gives the imported targets vramkit::vramkit and
# vramkit::vramkit_static, with a version file) and a pkg-config file (vramkit.pc).
# Included at the end of the top-level CMakeLists.txt, after the targets exist.
#
# Not under scikit-build-core: the wheel installs the shared library into the Python
# package itself (python/CMakeLists.txt), and a system-style layout there would be dead
# weight in every wheel.
if(SKBUILD)
  return()
endif()

include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(VRAMKIT_CMAKE_DIR "${CMAKE_INSTALL_LIBDIR}/cmake/vramkit")

# The targets name include/ of the source tree, which is right for this build and wrong
# for an installed copy; an export must not carry source paths. Each directory stays as
# given for the build, and the installed targets point at the installed headers instead.
foreach(target vramkit vramkit_static)
  get_target_property(dirs ${target} INTERFACE_INCLUDE_DIRECTORIES)
  set(wrapped "")
  if(dirs)
    foreach(dir IN LISTS dirs)
      list(APPEND wrapped "$<BUILD_INTERFACE:${dir}>")
    endforeach()
  endif()
  list(APPEND wrapped "$<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>")
  set_property(TARGET ${target} PROPERTY INTERFACE_INCLUDE_DIRECTORIES "${wrapped}")
endforeach()

install(TARGETS vramkit vramkit_static EXPORT vramkitTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# vramkit_record.h: the layout of the published per-process record, for other readers.
install(FILES ${PROJECT_SOURCE_DIR}/include/vramkit.h ${PROJECT_SOURCE_DIR}/include/vramkit_record.h
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
# The vramkit command (replay, bench) goes on the PATH beside the library it is built on.
if(VRAMKIT_BUILD_TOOLS)
  install(TARGETS vramkit_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()

install(EXPORT vramkitTargets NAMESPACE vramkit:: DESTINATION ${VRAMKIT_CMAKE_DIR})
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/vramkitConfig.cmake.in
  ${PROJECT_BINARY_DIR}/vramkitConfig.cmake
  INSTALL_DESTINATION ${VRAMKIT_CMAKE_DIR})
# 0.x: a minor release may change the API, so only the same minor version is compatible.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/vramkitConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/vramkitConfig.cmake
              ${PROJECT_BINARY_DIR}/vramkitConfigVersion.cmake
  DESTINATION ${VRAMKIT_CMAKE_DIR})

# pkg-config: the .pc finds its prefix from its own place (${pcfiledir}), so that a tree
# installed with `cmake --install --prefix DIR`, or moved, still resolves; the prefix
# given at configure time would be wrong for both.
file(RELATIVE_PATH up "/prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/prefix")
string(REGEX REPLACE "/$" "" up "${up}")
set(VRAMKIT_PC_PREFIX "\${pcfiledir}/${up}")
foreach(kind LIBDIR INCLUDEDIR)
  if(IS_ABSOLUTE "${CMAKE_INSTALL_${kind}}")
    set(VRAMKIT_PC_${kind} "${CMAKE_INSTALL_${kind}}")
  else()
    set(VRAMKIT_PC_${kind} "\${prefix}/${CMAKE_INSTALL_${kind}}")
  endif()
endforeach()
set(VRAMKIT_PC_LIBS_PRIVATE "-lpthread")
set(VRAMKIT_PC_LIBS m)
if(ZLIB_FOUND)
  list(APPEND VRAMKIT_PC_LIBS z)
endif()
foreach(lib ${CMAKE_DL_LIBS} ${VRAMKIT_PC_LIBS})
  string(APPEND VRAMKIT_PC_LIBS_PRIVATE " -l${lib}")
endforeach()
configure_file(${CMAKE_CURRENT_LIST_DIR}/vramkit.pc.in ${PROJECT_BINARY_DIR}/vramkit.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/vramkit.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

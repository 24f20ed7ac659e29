# find_package(memfit) for C++ users, from a build tree (memfit_DIR=build)
# or an install prefix: targets memfit::core (no torch) and memfit::torch.
include(CMakePackageConfigHelpers)
include(GNUInstallDirs)

set(MEMFIT_EXPORTED memfit_core)
if(TARGET memfit_torch)
  list(APPEND MEMFIT_EXPORTED memfit_torch)
  set(MEMFIT_NEEDS_TORCH ON)
else()
  set(MEMFIT_NEEDS_TORCH OFF)
endif()

install(TARGETS ${MEMFIT_EXPORTED} EXPORT memfitTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/memfit
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
if(TARGET memfit_cli)
  install(TARGETS memfit_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()

set(MEMFIT_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/memfit)
install(EXPORT memfitTargets NAMESPACE memfit:: DESTINATION ${MEMFIT_CMAKE_DIR})
export(EXPORT memfitTargets NAMESPACE memfit::
       FILE ${PROJECT_BINARY_DIR}/memfitTargets.cmake)

# memfit::torch links MemfitTorch::libtorch, an imported target of this
# machine's torch: the config remakes it on the user's side with the same
# module (See Note [Torch from Python]), from the Python that built memfit
# unless the user names another (Python_EXECUTABLE) or a Torch_DIR.
if(MEMFIT_NEEDS_TORCH)
  foreach(f TorchFromPython.cmake torch_flags.py)
    configure_file(${PROJECT_SOURCE_DIR}/cmake/${f} ${PROJECT_BINARY_DIR}/${f} COPYONLY)
    install(FILES ${PROJECT_SOURCE_DIR}/cmake/${f} DESTINATION ${MEMFIT_CMAKE_DIR})
  endforeach()
endif()

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/memfitConfig.cmake.in
  ${PROJECT_BINARY_DIR}/memfitConfig.cmake INSTALL_DESTINATION ${MEMFIT_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/memfitConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/memfitConfig.cmake
              ${PROJECT_BINARY_DIR}/memfitConfigVersion.cmake
        DESTINATION ${MEMFIT_CMAKE_DIR})

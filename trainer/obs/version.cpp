#include "trainer/obs/version.h"

#include "absl/strings/str_cat.h"
#include "kernels/versions.h"
#include "parallel/nccl_comm.h"

#ifdef TRAINER_HAVE_CUDA
#include "kernels/cuda/cuda_ops.h"
#endif

namespace tr {

extern const char kGitVersion[];  // generated at build time (cmake/git_version.cmake)

std::string version_text() {
#ifdef TRAINER_HAVE_CUDA
  std::string s = absl::StrCat("trainer ", kGitVersion, " (", TR_BUILD_TYPE,
                               " build, backend cuda; cpu also)\n");
  LibraryVersions built = cuda::compiled_library_versions();
  built.nccl = nccl_compiled_version();
  LibraryVersions found = cuda::library_versions();
  found.nccl = nccl_version();
  absl::StrAppend(&s, "built with: ", describe_built(built), "\n");
  absl::StrAppend(
      &s, "found at run time: ", describe(found),
      found.cuda_driver == 0 ? "; no GPU driver (train.backend=cuda cannot run here)" : "", "\n");
  return s;
#else
  return absl::StrCat("trainer ", kGitVersion, " (", TR_BUILD_TYPE,
                      " build, backend cpu; built without CUDA: -DTRAINER_CUDA=OFF or no nvcc)\n");
#endif
}

}  // namespace tr

#include "trainer/obs/version.h"

#include "absl/strings/str_cat.h"
#include "kernels/device.h"
#include "kernels/versions.h"
#include "parallel/nccl_comm.h"

namespace tr {

extern const char kGitVersion[];  // generated at build time (cmake/git_version.cmake)

std::string version_text() {
  if (!cuda_built())
    return absl::StrCat(
        "trainer ", kGitVersion, " (", TR_BUILD_TYPE,
        " build, backend cpu; built without CUDA: -DTRAINER_CUDA=OFF or no nvcc)\n");
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
}

}  // namespace tr

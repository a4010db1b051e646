#include "kernels/versions.h"

#include "absl/strings/str_cat.h"

namespace tr {
namespace {

// CUDA's encoding: 13000 = 13.0, 12080 = 12.8.
std::string cuda_string(int64_t v) {
  return absl::StrCat(v / 1000, ".", v % 1000 / 10);
}
int64_t cuda_major(int64_t v) {
  return v / 1000;
}
// cuDNN 9, cuBLASLt and NCCL: major*10000 + minor*100 + patch.
std::string library_string(int64_t v) {
  return absl::StrCat(v / 10000, ".", v % 10000 / 100, ".", v % 100);
}

}  // namespace

std::string describe(const LibraryVersions& v) {
  std::string s =
      absl::StrCat("CUDA runtime ", cuda_string(v.cuda_runtime), " (built with ",
                   cuda_string(v.cuda_toolkit), ", driver ", cuda_string(v.cuda_driver), ")");
  if (v.cublaslt != 0)
    absl::StrAppend(&s, ", cuBLASLt ", library_string(v.cublaslt), " (CUDA ",
                    cuda_string(v.cublaslt_cudart), ")");
  if (v.cudnn != 0)
    absl::StrAppend(&s, ", cuDNN ", library_string(v.cudnn), " (CUDA ", cuda_string(v.cudnn_cudart),
                    ")");
  if (v.nccl != 0) absl::StrAppend(&s, ", NCCL ", library_string(v.nccl));
  return s;
}

std::string describe_built(const LibraryVersions& v) {
  std::string s = absl::StrCat("CUDA ", cuda_string(v.cuda_toolkit));
  if (v.cublaslt != 0) absl::StrAppend(&s, ", cuBLASLt ", library_string(v.cublaslt));
  if (v.cudnn != 0) absl::StrAppend(&s, ", cuDNN ", library_string(v.cudnn));
  if (v.nccl != 0) absl::StrAppend(&s, ", NCCL ", library_string(v.nccl));
  return s;
}

absl::Status check_versions(const LibraryVersions& v) {
  const int64_t major = cuda_major(v.cuda_toolkit);
  if (cuda_major(v.cuda_runtime) != major)
    return absl::FailedPreconditionError(
        absl::StrCat("the CUDA runtime loaded is ", cuda_string(v.cuda_runtime),
                     " but the trainer was built with CUDA ", cuda_string(v.cuda_toolkit),
                     "; put the runtime of CUDA ", major,
                     " first on LD_LIBRARY_PATH or rebuild with the toolkit installed here"));
  if (cuda_major(v.cuda_driver) < major)
    return absl::FailedPreconditionError(
        absl::StrCat("the GPU driver supports CUDA up to ", cuda_string(v.cuda_driver),
                     ", older than the CUDA ", cuda_string(v.cuda_runtime),
                     " the trainer runs on; update the driver or build with an older toolkit"));
  struct Lib {
    const char* name;
    int64_t version, cudart;
  };
  for (const Lib& l :
       {Lib{"cuDNN", v.cudnn, v.cudnn_cudart}, Lib{"cuBLASLt", v.cublaslt, v.cublaslt_cudart}}) {
    if (l.version != 0 && cuda_major(l.cudart) != major)
      return absl::FailedPreconditionError(absl::StrCat(
          l.name, " ", library_string(l.version), " was built for CUDA ", cuda_string(l.cudart),
          ", not CUDA ", major, " as the trainer; install the ", l.name, " for CUDA ", major,
          " (e.g. the cu", major, " wheel) and put it first on LD_LIBRARY_PATH"));
  }
  return absl::OkStatus();
}

}  // namespace tr

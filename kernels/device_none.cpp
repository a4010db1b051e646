// kernels/device.h in a build without the CUDA backend: no devices, no libraries, nothing to
// time. Making a device context here is a caller's error (it asks device_available() first).
#include "core/check.h"
#include "kernels/device.h"

namespace tr {

bool cuda_built() {
  return false;
}
void profiler_range_push(const char*) {}
void profiler_range_pop() {}
void profiler_capture(bool) {}

namespace cuda {

bool device_available() {
  return false;
}
int device_count() {
  return 0;
}
std::string device_name(int) {
  return "";
}
Fp8Support fp8_support(int) {
  return {};
}
std::string device_pci_bus_id(int) {
  return "";
}
LibraryVersions library_versions() {
  return {};
}
LibraryVersions compiled_library_versions() {
  return {};
}

DeviceContext::DeviceContext(int index, size_t) : index_(index) {
  TR_ASSERT(false, "DeviceContext: this build has no CUDA backend (ask device_available() first)");
}
DeviceContext::~DeviceContext() = default;
Ctx DeviceContext::ctx() const {
  return Ctx{};
}
void DeviceContext::synchronize() const {}

EventTimeline::EventTimeline(const Ctx&, int) : stream_(nullptr) {
  TR_ASSERT(false, "EventTimeline: this build has no CUDA backend (ask device_available() first)");
}
EventTimeline::~EventTimeline() = default;
void EventTimeline::mark(int) {}
void EventTimeline::collect(double*, int, int64_t) {}

}  // namespace cuda
}  // namespace tr

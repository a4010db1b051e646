// `trainer --version`: what this binary is and what it runs on.
#pragma once

#include <string>

namespace tr {

// "trainer v0.1-12-gabc1234 (Release build, backend cuda)", then the GPU libraries' versions
// it was built with and those it finds at run time (a CUDA build), or that it has none.
std::string version_text();

}  // namespace tr

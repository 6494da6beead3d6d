// toml++ as jobspec uses it: header-only, exceptions off, so nothing can escape into the SPANK
// plugin. Debian's pkg-config asks for the shared library (TOML_HEADER_ONLY=0), which is built
// with exceptions; toml++ keeps the two ABIs apart. Every jobspec source includes toml++ through
// this header and nothing outside jobspec includes toml++ at all.
#pragma once

#undef TOML_HEADER_ONLY
#undef TOML_SHARED_LIB
#define TOML_HEADER_ONLY 1
#define TOML_EXCEPTIONS 0
#include <toml++/toml.h>

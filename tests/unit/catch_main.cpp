#include <cstdlib>

// The programs read hwloc XML with hwloc's own minimal parser (see
// topology::prefer_minimal_xml_importer), so the tests read every fixture with it too.
static const bool minimal_xml_importer = [] { return ::setenv("HWLOC_LIBXML", "0", 1) == 0; }();

#if __has_include(<catch2/catch_test_macros.hpp>)
#include <catch2/catch_session.hpp>
int main(int argc, char* argv[]) { return Catch::Session().run(argc, argv); }
#else
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
#endif

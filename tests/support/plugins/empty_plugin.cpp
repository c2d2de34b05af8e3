// A shared library that loads fine but registers no accelerator.
#include "fulgor/core/version.h"

extern "C" int fulgor_test_empty_plugin_marker() { return FULGOR_PLUGIN_ABI_VERSION; }

// Plugins load into the one process-wide registry and cannot be unloaded, so
// each test loads them in a child process of its own (a death test that
// expects a clean exit).

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>

#include "fulgor/core/error.h"
#include "fulgor/core/registry.h"

namespace fulgor {
namespace {

class PluginTest : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

// Runs `body` in a child process; it passes when `body` returns true.
template <typename Body>
void in_child(Body body) {
  EXPECT_EXIT(
      {
        bool ok = false;
        try {
          ok = body();
        } catch (const std::exception& e) {
          std::cerr << "unexpected exception: " << e.what() << '\n';
        }
        std::exit(ok ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

// The PluginError message `path` gives, or "" when it loads.
std::string load_error(const std::string& path) {
  try {
    load_accelerator_plugin(path);
  } catch (const PluginError& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return true;
  std::cerr << "expected '" << part << "' in: " << text << '\n';
  return false;
}

TEST_F(PluginTest, ExamplePluginAppearsInTheRegistry) {
  in_child([] {
    auto& registry = AcceleratorRegistry::instance();
    if (registry.contains("vcpu")) return false;
    const std::string chosen = registry.resolve("auto");
    auto names = load_accelerator_plugin(FULGOR_VCPU_PLUGIN);
    if (names != std::vector<std::string>{"vcpu"}) return false;
    // Loading again is harmless and answers the same.
    if (load_accelerator_plugin(FULGOR_VCPU_PLUGIN) != names) return false;
    AcceleratorInfo info = registry.describe("vcpu");
    auto vcpu = registry.create("vcpu");
    return info.available && info.device_count == 2 && info.priority == -10 &&
           contains(info.origin, "libfulgor_vcpu.so") && vcpu->parse_devices("0,1").size() == 2 &&
           registry.resolve("auto") == chosen;  // priority -10 never outranks a built-in
  });
}

TEST_F(PluginTest, LoadsFromTheEnvironmentOnFirstUse) {
  in_child([] {
    setenv("FULGOR_ACCELERATOR_PLUGINS", ":" FULGOR_VCPU_PLUGIN ":", 1);
    setenv("VCPU_DEVICE_COUNT", "5", 1);
    auto& registry = AcceleratorRegistry::instance();
    return registry.contains("vcpu") && registry.create("vcpu")->device_count() == 5;
  });
}

TEST_F(PluginTest, EnvironmentFailureIsReportedOnUse) {
  in_child([] {
    setenv("FULGOR_ACCELERATOR_PLUGINS", "/nonexistent/libnothing.so", 1);
    try {
      AcceleratorRegistry::instance();
    } catch (const PluginError& e) {
      return contains(e.what(),
                      "FULGOR_ACCELERATOR_PLUGINS: accelerator plugin '/nonexistent/libnothing.so' "
                      "does not exist");
    }
    return false;
  });
}

TEST_F(PluginTest, MissingFile) {
  in_child(
      [] { return contains(load_error("/nonexistent/libnothing.so"), "'/nonexistent/libnothing.so' does not exist"); });
}

// dlopen of a FIFO would wait for a writer; a death test that hangs fails by its timeout.
TEST_F(PluginTest, AFifoIsRefusedWithoutWaiting) {
  in_child([] {
    const std::string fifo = ::testing::TempDir() + "/fulgor_plugin_fifo_" + std::to_string(::getpid()) + ".so";
    if (::mkfifo(fifo.c_str(), 0600) != 0) return false;
    const std::string error = load_error(fifo);
    ::unlink(fifo.c_str());
    return contains(error, "accelerator plugin '" + fifo + "' is a FIFO, not a regular file");
  });
}

TEST_F(PluginTest, NotASharedLibrary) {
  in_child([] {
    std::string error = load_error(FULGOR_NOT_A_LIBRARY);
    return contains(error, "cannot load accelerator plugin '" FULGOR_NOT_A_LIBRARY "'") &&
           !AcceleratorRegistry::instance().contains("future");
  });
}

TEST_F(PluginTest, OtherAbiVersionIsRefusedNamingBoth) {
  in_child([] {
    std::string error = load_error(FULGOR_ABI_MISMATCH_PLUGIN);
    std::string expected = "accelerator plugin '" FULGOR_ABI_MISMATCH_PLUGIN
                           "' was built for fulgor plugin ABI version " +
                           std::to_string(FULGOR_PLUGIN_ABI_VERSION + 998) +
                           ", but this fulgor (" FULGOR_VERSION_STRING ") has plugin ABI version " +
                           std::to_string(FULGOR_PLUGIN_ABI_VERSION);
    // A second attempt gives the same answer rather than "registers nothing".
    return contains(error, expected) && load_error(FULGOR_ABI_MISMATCH_PLUGIN) == error &&
           !AcceleratorRegistry::instance().contains("future");
  });
}

TEST_F(PluginTest, DuplicateNameRegistersNothing) {
  in_child([] {
    std::string error = load_error(FULGOR_DUPLICATE_PLUGIN);
    auto& registry = AcceleratorRegistry::instance();
    return contains(error, "accelerator plugin '" FULGOR_DUPLICATE_PLUGIN "' cannot be registered") &&
           contains(error, "'cpu' is already registered (by fulgor's built-in accelerators in ") &&
           contains(error, "libfulgor.so") && contains(error, "load one of the two") &&
           !registry.contains("innocent") && registry.create("cpu")->description().find("claims") == std::string::npos;
  });
}

// A shared library's ELF header for another machine than this program's: the
// loader's own message ("wrong ELF class", "cannot open") says little.
TEST_F(PluginTest, LibraryForAnotherMachineSaysWhichItIs) {
  in_child([] {
#if defined(__aarch64__)
    const uint16_t other = 62;  // EM_X86_64
    const std::string expected = "was built for x86_64; this program is aarch64";
#else
    const uint16_t other = 183;  // EM_AARCH64
    const std::string expected = "was built for aarch64; this program is x86_64";
#endif
    std::string header(64, '\0');
    header.replace(0, 4,
                   "\x7f"
                   "ELF");
    header[4] = 2;   // 64-bit
    header[5] = 1;   // little-endian
    header[6] = 1;   // version
    header[16] = 3;  // a shared object
    header[18] = static_cast<char>(other & 0xff);
    header[19] = static_cast<char>(other >> 8);
    const std::string path = ::testing::TempDir() + "/fulgor_foreign_plugin_" + std::to_string(::getpid()) + ".so";
    std::ofstream(path, std::ios::binary).write(header.data(), static_cast<std::streamsize>(header.size()));
    const std::string error = load_error(path);
    std::remove(path.c_str());
    return contains(error, "accelerator plugin '" + path + "' " + expected);
  });
}

// A name without a slash is the dynamic loader's to find; when it does not,
// the error says where it looked.
TEST_F(PluginTest, BareNameIsLookedUpOnTheLoadersPath) {
  in_child([] {
    return contains(load_error("libfulgor_no_such_plugin.so"),
                    "cannot load accelerator plugin 'libfulgor_no_such_plugin.so'") &&
           contains(load_error("libfulgor_no_such_plugin.so"),
                    "a name without a slash is looked up where the dynamic "
                    "loader looks for libraries: LD_LIBRARY_PATH");
  });
}

TEST_F(PluginTest, LibraryWithoutRegistrations) {
  in_child([] { return contains(load_error(FULGOR_EMPTY_PLUGIN), "registers no accelerator"); });
}

}  // namespace
}  // namespace fulgor

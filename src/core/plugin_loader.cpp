// Load-time registration and the plugin loader.
//
// Note [Staged plugin registration]
// A plugin's REGISTER_ACCELERATOR runs inside dlopen, before the loader can
// look at the library. So while load_accelerator_plugin() has a library open,
// registrations are only collected; the loader then checks the plugin ABI
// version each one was compiled with, that there is at least one, and that no
// name is taken, and commits all of them or none. Registrations outside the
// loader (libfulgor's built-ins, a library linked into the program) commit at
// once; since static initialisers cannot throw, their errors are kept and
// thrown by the first registry lookup.

#include <dlfcn.h>
#include <elf.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cerrno>
#include <cstdlib>
#include <map>
#include <mutex>

#include "core/registry_access.h"
#include "detail/read_at.h"
#include "detail/regular_file.h"
#include "fulgor/core/error.h"
#include "fulgor/core/version.h"

namespace fulgor {
namespace detail {
using impl::AcceleratorCreator;

namespace {

struct Staged {
  int abi_version;
  std::string name;
  AcceleratorCreator creator;
};

struct PluginLoad {
  std::vector<Staged> staged;
};

thread_local PluginLoad* current_load = nullptr;
// What made the loader run, for the origin of what it registers.
thread_local const char* loaded_by = "by load_accelerator_plugin";

std::mutex& errors_mutex() {
  static std::mutex m;
  return m;
}
std::vector<std::string>& load_time_errors() {
  static auto* errors = new std::vector<std::string>();
  return *errors;
}

// The shared object holding `address`: where an accelerator came from.
std::string library_at(const void* address) {
  Dl_info info{};
  if (dladdr(address, &info) != 0 && info.dli_fname != nullptr && info.dli_fname[0] != '\0') return info.dli_fname;
  return "the program";
}
std::string library_of(AcceleratorCreator creator) { return library_at(reinterpret_cast<const void*>(creator)); }

// Where a registration outside the loader came from: libfulgor's built-ins, or
// a library that registered as it loaded (linked into the program).
std::string origin_at_load(AcceleratorCreator creator) {
  const std::string library = library_of(creator);
  static const char in_libfulgor = 0;
  if (library == library_at(&in_libfulgor)) return fmt::format("fulgor's built-in accelerators in {}", library);
  return fmt::format("{}, as it loaded (not through the plugin loader)", library);
}

RegistryAccess::Entry make_entry(const std::string& name, AcceleratorCreator creator, std::string origin) {
  RegisterOptions options;
  options.origin = std::move(origin);
  return RegistryAccess::make_entry(name, creator, std::move(options));
}

std::string abi_mismatch(const std::string& what, int abi_version) {
  return fmt::format(
      "{} was built for fulgor plugin ABI version {}, but this fulgor ({}) has plugin ABI version {}; rebuild it "
      "against this fulgor's headers",
      what, abi_version, FULGOR_VERSION_STRING, FULGOR_PLUGIN_ABI_VERSION);
}

}  // namespace

void register_at_load(int abi_version, const char* name, AcceleratorCreator creator) noexcept {
  if (current_load != nullptr) {
    current_load->staged.push_back({abi_version, name, creator});
    return;
  }
  std::string error;
  try {
    if (abi_version != FULGOR_PLUGIN_ABI_VERSION) {
      error = abi_mismatch(fmt::format("accelerator '{}' in {}", name, library_of(creator)), abi_version);
    } else {
      std::vector<RegistryAccess::Entry> entries;
      entries.push_back(make_entry(name, creator, origin_at_load(creator)));
      error = RegistryAccess::add_all(std::move(entries));
      if (!error.empty()) error += fmt::format(", and {} registers it again", origin_at_load(creator));
    }
  } catch (const std::exception& e) {
    error = fmt::format("registering accelerator '{}' from {} failed: {}", name, library_of(creator), e.what());
  }
  if (!error.empty()) {
    std::lock_guard<std::mutex> lock(errors_mutex());
    load_time_errors().push_back(std::move(error));
  }
}

void throw_load_time_errors() {
  std::lock_guard<std::mutex> lock(errors_mutex());
  if (!load_time_errors().empty()) throw RegistryError(fmt::format("{}", fmt::join(load_time_errors(), "; ")));
}

void load_plugins_from_environment() {
  static std::once_flag loaded;
  // call_once retries after an exception, so a failed load is reported again.
  std::call_once(loaded, [] {
    const char* list = std::getenv("FULGOR_ACCELERATOR_PLUGINS");
    if (list == nullptr) return;
    std::string paths = list;
    size_t start = 0;
    while (start <= paths.size()) {
      size_t colon = paths.find(':', start);
      std::string path = paths.substr(start, colon == std::string::npos ? std::string::npos : colon - start);
      if (!path.empty()) {
        loaded_by = "from FULGOR_ACCELERATOR_PLUGINS";
        try {
          load_accelerator_plugin(path);
        } catch (const PluginError& e) {
          loaded_by = "by load_accelerator_plugin";
          throw PluginError(fmt::format("FULGOR_ACCELERATOR_PLUGINS: {}", e.what()));
        }
        loaded_by = "by load_accelerator_plugin";
      }
      if (colon == std::string::npos) break;
      start = colon + 1;
    }
  });
}

namespace {

// The machine an ELF file was built for (its e_machine), or -1 when the file
// is no ELF file.
int elf_machine(const std::string& path) {
  unsigned char header[20] = {};
  const RegularFile file = RegularFile::open(path);
  if (!file || !read_at(file.fd(), 0, header, sizeof header) || header[EI_MAG0] != ELFMAG0 ||
      header[EI_MAG1] != ELFMAG1 || header[EI_MAG2] != ELFMAG2 || header[EI_MAG3] != ELFMAG3)
    return -1;
  const bool big_endian = header[EI_DATA] == ELFDATA2MSB;
  return big_endian ? header[18] << 8 | header[19] : header[19] << 8 | header[18];
}

std::string machine_name(int machine) {
  switch (machine) {
    case EM_X86_64:
      return "x86_64";
    case EM_386:
      return "i386";
    case EM_AARCH64:
      return "aarch64";
    case EM_ARM:
      return "arm";
    case EM_PPC64:
      return "ppc64";
    case EM_S390:
      return "s390x";
    case EM_RISCV:
      return "riscv";
    default:
      return fmt::format("ELF machine {}", machine);
  }
}

// Why dlopen refused `path`: a library built for another machine says so in
// words; otherwise the loader's message.
std::string load_failure(const std::string& path, const char* why) {
  const int plugin = elf_machine(path), program = elf_machine("/proc/self/exe");
  if (plugin >= 0 && program >= 0 && plugin != program)
    return fmt::format("accelerator plugin '{}' was built for {}; this program is {}", path, machine_name(plugin),
                       machine_name(program));
  std::string message = fmt::format("cannot load accelerator plugin '{}': {}", path, why ? why : "unknown error");
  if (path.find('/') == std::string::npos)
    message +=
        " (a name without a slash is looked up where the dynamic loader looks for libraries: "
        "LD_LIBRARY_PATH, the ld.so cache and the system's library folders; give a path to load a file)";
  return message;
}

}  // namespace
}  // namespace detail

void impl::register_accelerator_at_load(int abi_version, const char* name, AcceleratorCreator creator) noexcept {
  detail::register_at_load(abi_version, name, creator);
}

std::vector<std::string> load_accelerator_plugin(const std::string& path) {
  // One load at a time; a library opened again keeps its first outcome, since
  // dlopen does not run its initialisers twice.
  static std::mutex mutex;
  static auto* outcomes = new std::map<void*, std::pair<std::vector<std::string>, std::string>>();
  std::lock_guard<std::mutex> lock(mutex);

  // A name without a slash is the dynamic loader's to find (dlopen(3)).
  // A FIFO would block dlopen (Note [Opening a user's path]).
  if (path.find('/') != std::string::npos)
    if (const auto file = detail::RegularFile::open(path); !file)
      throw PluginError(
          fmt::format("accelerator plugin '{}' {}", path, file.error() == ENOENT ? "does not exist" : file.problem()));

  detail::PluginLoad load;
  detail::current_load = &load;
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  detail::current_load = nullptr;
  if (handle == nullptr) throw PluginError(detail::load_failure(path, dlerror()));

  auto known = outcomes->find(handle);
  if (known == outcomes->end()) {
    std::vector<std::string> names;
    std::string error;
    std::vector<detail::RegistryAccess::Entry> entries;
    for (const detail::Staged& s : load.staged) {
      if (s.abi_version != FULGOR_PLUGIN_ABI_VERSION) {
        error = detail::abi_mismatch(fmt::format("accelerator plugin '{}'", path), s.abi_version);
        break;
      }
      entries.push_back(
          detail::make_entry(s.name, s.creator, fmt::format("plugin '{}', loaded {}", path, detail::loaded_by)));
      names.push_back(s.name);
    }
    if (error.empty() && entries.empty())
      error =
          fmt::format("accelerator plugin '{}' registers no accelerator (a plugin uses REGISTER_ACCELERATOR)", path);
    if (error.empty()) {
      error = detail::RegistryAccess::add_all(std::move(entries));
      if (!error.empty())
        error = fmt::format(
            "accelerator plugin '{}' cannot be registered: {}; a plugin cannot replace an accelerator: load one of "
            "the two, or give one another name",
            path, error);
    }
    if (!error.empty()) names.clear();
    known = outcomes->emplace(handle, std::make_pair(std::move(names), std::move(error))).first;
  }
  if (!known->second.second.empty()) throw PluginError(known->second.second);
  return known->second.first;
}

}  // namespace fulgor

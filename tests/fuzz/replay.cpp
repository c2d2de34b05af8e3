// Runs every file of a corpus folder through a fuzz target, in name order,
// naming each before it runs, so that a failing one is known:
//
//   fulgor_fuzz_replay devices|options|checkpoint|torch_file|safetensors|image|tar_shard|dcp_metadata CORPUS_FOLDER
//
// `fulgor_fuzz_replay --write-checkpoint-seed FILE` writes the valid
// checkpoint of the checkpoint target's corpus, and
// `fulgor_fuzz_replay --write-image-seeds FOLDER` the valid images of the
// image target's.
//
// Each input must end within 60 seconds, or the replay fails naming it; the
// tests run it with its address space limited to 8 GiB (CMakeLists.txt), so
// that a reader allocating from a declared size fails them too: the bounds a
// file from elsewhere is read within (docs/fuzzing.md).

#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "fuzz.h"

namespace {

constexpr unsigned kSecondsEach = 60;

void input_took_too_long(int) {
  static const char message[] = "fuzz: the input named last ran past 60 seconds\n";
  (void)!::write(STDERR_FILENO, message, sizeof message - 1);
  ::_exit(3);
}

}  // namespace

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  using Target = void (*)(const uint8_t*, size_t);
  const std::map<std::string, Target> targets = {
      {"devices", fulgor::fuzz::devices},         {"options", fulgor::fuzz::options},
      {"checkpoint", fulgor::fuzz::checkpoint},   {"torch_file", fulgor::fuzz::torch_file},
      {"safetensors", fulgor::fuzz::safetensors}, {"image", fulgor::fuzz::image},
      {"tar_shard", fulgor::fuzz::tar_shard},
      {"dcp_metadata", fulgor::fuzz::dcp_metadata}};
  if (argc == 3 && std::string(argv[1]) == "--write-checkpoint-seed") {
    fulgor::fuzz::write_checkpoint_seed(argv[2]);
    return 0;
  }
  if (argc == 3 && std::string(argv[1]) == "--write-image-seeds") {
    fulgor::fuzz::write_image_seeds(argv[2]);
    return 0;
  }
  const auto target = argc == 3 ? targets.find(argv[1]) : targets.end();
  if (target == targets.end() || !fs::is_directory(argv[2])) {
    std::fprintf(stderr, "usage: %s devices|options|checkpoint|torch_file|safetensors|image|tar_shard|dcp_metadata CORPUS_FOLDER\n",
                 argv[0]);
    return 2;
  }
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(argv[2]))
    if (entry.is_regular_file()) files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  std::signal(SIGALRM, input_took_too_long);
  for (const auto& file : files) {
    std::printf("%s\n", file.filename().c_str());
    std::fflush(stdout);
    std::ifstream in(file, std::ios::binary);
    const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ::alarm(kSecondsEach);
    target->second(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    ::alarm(0);
  }
  std::printf("%zu inputs of %s ran\n", files.size(), target->first.c_str());
  return files.empty() ? 1 : 0;
}

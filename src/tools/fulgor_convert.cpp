// fulgor-convert: weights between torch.save state dicts, Lightning
// checkpoints, fulgor checkpoints, safetensors and distributed checkpoints
// (PyTorch's DCP folders).
//
//   fulgor-convert SRC DST                  SRC's tensors written to DST, in
//                                           the format DST's extension names;
//                                           a DST without one (or ending in
//                                           /) is a distributed checkpoint
//   fulgor-convert --list [--checksum] FILE each tensor's name, dtype, shape
//                                           (and XXH3-64 of its values)
//
// SRC's format is read from its content; a folder with a .metadata is a
// distributed checkpoint, whose tensors are named by their flattened keys
// ("model.0.weight") and whose other values are left out. Exits 1 with the
// error when a file cannot be read or written, 2 on a bad command line.

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>
#include <iostream>
#include <utility>
#include <string>
#include <vector>

#include "fulgor/core/error.h"
#include "fulgor/interop/distributed_checkpoint.h"
#include "fulgor/interop/weights_file.h"

namespace {

int usage(const std::string& problem) {
  std::cerr << "fulgor-convert: " << problem
            << "\nusage: fulgor-convert SRC DST.{safetensors,pt,pth,bin} | DST_FOLDER/\n"
               "       fulgor-convert --list [--checksum] FILE\n";
  return 2;
}

// SRC's tensors and the name of its format.
std::pair<fulgor::StateDict, std::string> read_source(const std::string& path) {
  if (!fulgor::is_distributed_checkpoint(path)) {
    fulgor::WeightsFormat format;
    fulgor::StateDict state = fulgor::read_weights(path, &format);
    return {state, fulgor::to_string(format)};
  }
  fulgor::StateDict state;
  for (const auto& entry : fulgor::flatten_state_dict(fulgor::read_distributed_checkpoint(path)))
    if (entry.value.isTensor()) state.insert(entry.fqn(), entry.value.toTensor());
  return {state, "distributed checkpoint"};
}

bool names_folder(const std::string& path) {
  return !path.empty() && (path.back() == '/' || !std::filesystem::path(path).has_extension());
}

void list(const std::string& path, bool checksum) {
  auto [state, format] = read_source(path);
  std::cout << fmt::format("# {}: {}, {} tensors\n", path, format, state.size());
  for (const auto& entry : state) {
    const torch::Tensor& t = entry.value();
    std::string line = fmt::format("{}\t{}\t[{}]", entry.key(), c10::toString(t.scalar_type()), fmt::join(t.sizes(), ", "));
    if (checksum) line += fmt::format("\t{:016x}", fulgor::tensor_checksum(t));
    std::cout << line << '\n';
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  try {
    if (!args.empty() && args[0] == "--list") {
      bool checksum = args.size() == 3 && args[1] == "--checksum";
      if (args.size() != (checksum ? 3u : 2u)) return usage("--list takes [--checksum] and one FILE");
      list(args.back(), checksum);
      return 0;
    }
    if (args.size() != 2) return usage("expected SRC and DST");
    auto [state, format] = read_source(args[0]);
    if (names_folder(args[1])) {
      fulgor::DistributedStateDict flat;
      for (const auto& entry : state) flat.push_back({{entry.key()}, entry.value(), std::nullopt});
      std::string folder = args[1];
      while (folder.size() > 1 && folder.back() == '/') folder.pop_back();
      fulgor::save_distributed_checkpoint(flat, folder);
    } else {
      fulgor::write_weights(state, args[1]);
    }
    std::cout << fmt::format("{} tensors from {} ({}) to {}\n", state.size(), args[0], format, args[1]);
    return 0;
  } catch (const std::exception& e) {  // fulgor::Error, and what a library below throws
    std::cerr << "fulgor-convert: " << e.what() << '\n';
    return 1;
  }
}

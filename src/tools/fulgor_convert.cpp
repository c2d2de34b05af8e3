// fulgor-convert: weights between torch.save state dicts, Lightning
// checkpoints, fulgor checkpoints and safetensors.
//
//   fulgor-convert SRC DST                  SRC's tensors written to DST, in
//                                           the format DST's extension names
//   fulgor-convert --list [--checksum] FILE each tensor's name, dtype, shape
//                                           (and XXH3-64 of its values)
//
// SRC's format is read from its content. Exits 1 with the error when a file
// cannot be read or written, 2 on a bad command line.

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <iostream>
#include <string>
#include <vector>

#include "fulgor/core/error.h"
#include "fulgor/interop/weights_file.h"

namespace {

int usage(const std::string& problem) {
  std::cerr << "fulgor-convert: " << problem
            << "\nusage: fulgor-convert SRC DST.{safetensors,pt,pth,bin}\n"
               "       fulgor-convert --list [--checksum] FILE\n";
  return 2;
}

void list(const std::string& path, bool checksum) {
  fulgor::WeightsFormat format;
  fulgor::StateDict state = fulgor::read_weights(path, &format);
  std::cout << fmt::format("# {}: {}, {} tensors\n", path, fulgor::to_string(format), state.size());
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
    fulgor::WeightsFormat format;
    fulgor::StateDict state = fulgor::read_weights(args[0], &format);
    fulgor::write_weights(state, args[1]);
    std::cout << fmt::format("{} tensors from {} ({}) to {}\n", state.size(), args[0], fulgor::to_string(format), args[1]);
    return 0;
  } catch (const std::exception& e) {  // fulgor::Error, and what a library below throws
    std::cerr << "fulgor-convert: " << e.what() << '\n';
    return 1;
  }
}

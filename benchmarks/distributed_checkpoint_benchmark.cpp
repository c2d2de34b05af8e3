// Saving and loading a sharded state: at 2 and 4 CPU ranks started by
// fulgor-run, every rank holding its rows of each tensor of a three-layer
// model and of Adam's two moments, as a sharded fit does. A distributed
// checkpoint (every rank writes its rows, rank 0 the metadata) against what
// a save through rank 0 does: the whole state gathered to rank 0, which
// writes one torch.save file; and loading each: every rank reading the byte
// ranges of its rows, against every rank reading the whole file and keeping
// its rows. Both saves end with their files on disk (fsync).

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "benchmarks.h"
#include "fulgor/core/registry.h"
#include "fulgor/distributed/environment.h"
#include "fulgor/distributed/process_group.h"
#include "fulgor/interop/distributed_checkpoint.h"
#include "fulgor/interop/torch_load.h"
#include "fulgor/interop/torch_save.h"

namespace fulgor::bench {
namespace {

// Each tensor's name and whole shape: three width x width layers, their
// biases, and Adam's exp_avg and exp_avg_sq of each.
std::vector<std::pair<std::string, std::vector<int64_t>>> tensors_of(int64_t width) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  for (const char* kind : {"param", "exp_avg", "exp_avg_sq"})
    for (int layer = 0; layer < 3; ++layer) {
      out.push_back({fmt::format("{}.{}.weight", kind, 2 * layer), {width, width}});
      out.push_back({fmt::format("{}.{}.bias", kind, 2 * layer), {width}});
    }
  return out;
}

double seconds_of(ProcessGroup& group, const std::function<void()>& run) {
  group.barrier();
  const auto start = std::chrono::steady_clock::now();
  run();
  group.barrier();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void fsync_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

}  // namespace

int distributed_checkpoint_child(int64_t width, int repeats, const std::string& out) {
  const DistributedEnvironment env = detect_distributed_environment();
  auto cpu = make_accelerator("cpu");
  ProcessGroup group(env, *cpu, torch::Device(torch::kCPU));
  const int64_t rows = width / env.world_size, first = env.rank * rows;
  DistributedStateDict pieces, blanks;
  for (const auto& [name, size] : tensors_of(width)) {
    std::vector<int64_t> local = size, offsets(size.size(), 0);
    local[0] = rows;
    offsets[0] = first;
    pieces.push_back({{name}, torch::randn(local), TensorPlacement{offsets, size}});
    blanks.push_back({{name}, torch::zeros(local), TensorPlacement{offsets, size}});
  }
  const std::string folder = out + "/state.dcp", file = out + "/state.pt";
  std::vector<double> save_dcp, save_file, load_dcp, load_file;
  for (int r = 0; r < repeats; ++r) {
    save_dcp.push_back(seconds_of(group, [&] { save_distributed_checkpoint(pieces, folder, &group); }));
    save_file.push_back(seconds_of(group, [&] {
      StateDict whole;
      for (const auto& piece : pieces) {
        auto gathered = group.gather(piece.value.toTensor());
        if (env.rank == 0) whole.insert(piece.fqn(), torch::cat(gathered));
      }
      if (env.rank == 0) {
        save_state_dict(whole, file);
        fsync_file(file);
      }
    }));
    load_dcp.push_back(seconds_of(group, [&] { load_distributed_checkpoint(blanks, folder); }));
    load_file.push_back(seconds_of(group, [&] {
      auto loaded = torch_load(file).toGenericDict();
      for (auto& blank : blanks)
        blank.value.toTensor().copy_(loaded.at(blank.fqn()).toTensor().narrow(0, first, rows));
    }));
  }
  if (env.rank == 0) {
    int64_t bytes = 0;
    for (const auto& entry : std::filesystem::directory_iterator(folder)) bytes += entry.file_size();
    nlohmann::json json = {{"save_dcp", median(save_dcp)},   {"save_file", median(save_file)},
                           {"load_dcp", median(load_dcp)},   {"load_file", median(load_file)},
                           {"bytes", bytes}};
    std::ofstream(out + "/figures.json") << json.dump();
  }
  return 0;
}

void distributed_checkpoint_rows(Report& report, const Settings& settings) {
  const int64_t width = settings.quick ? 256 : 2048;
  const double parameters = 3.0 * static_cast<double>(width * width + width);
  for (int ranks : {2, 4}) {
    const auto dir = std::filesystem::temp_directory_path() / fmt::format("fulgor-dcp-bench-{}", ::getpid());
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    const std::string command =
        fmt::format("{} --nproc-per-node {} -- /proc/{}/exe --distributed-checkpoint-child {} {} {} > {}/log 2>&1",
                    FULGOR_RUN_PATH, ranks, ::getpid(), width, settings.repeats, dir.string(), dir.string());
    if (std::system(command.c_str()) != 0) {
      std::ifstream log(dir / "log");
      std::cerr << log.rdbuf();
      throw std::runtime_error("the distributed checkpoint benchmark's ranks failed: " + command);
    }
    std::ifstream in(dir / "figures.json");
    const auto f = nlohmann::json::parse(in);
    const double save_dcp = f.at("save_dcp"), save_file = f.at("save_file");
    const double load_dcp = f.at("load_dcp"), load_file = f.at("load_file");
    const std::string what = fmt::format("{:.1f}M parameters + Adam, {} ranks", parameters / 1e6, ranks);
    report.row({"checkpoint", "gathered to rank 0, one torch.save file, " + what,
                fmt::format("save {:.0f} ms, load {:.0f} ms", save_file * 1e3, load_file * 1e3), ""});
    report.row({"checkpoint", fmt::format("distributed checkpoint, {} ranks, {:.0f} MB", ranks,
                                          f.at("bytes").get<double>() / 1e6),
                fmt::format("save {:.0f} ms, load {:.0f} ms", save_dcp * 1e3, load_dcp * 1e3),
                fmt::format("{:.2f}x the save's time, {:.2f}x the load's", save_dcp / save_file, load_dcp / load_file)});
    report.figures[fmt::format("checkpoint_dcp_{}_save_ratio", ranks)] = save_dcp / save_file;
    report.figures[fmt::format("checkpoint_dcp_{}_load_ratio", ranks)] = load_dcp / load_file;
    std::filesystem::remove_all(dir);
  }
}

}  // namespace fulgor::bench

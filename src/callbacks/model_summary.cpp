#include "fulgor/callbacks/model_summary.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <functional>
#include <iostream>
#include <sstream>
#include <vector>

#include "fulgor/module.h"

namespace fulgor {

std::string summarize(const torch::nn::Module& module, int64_t max_depth) {
  struct Row {
    std::string name, type;
    int64_t params;
  };
  std::vector<Row> rows;
  auto count = [](const torch::nn::Module& m) {
    int64_t n = 0;
    for (const auto& p : m.parameters()) n += p.numel();
    return n;
  };
  auto short_type = [](std::string type) {
    if (type.rfind("torch::nn::", 0) == 0) type = type.substr(11);
    if (type.size() > 4 && type.compare(type.size() - 4, 4, "Impl") == 0) type.resize(type.size() - 4);
    return type;
  };
  std::function<void(const torch::nn::Module&, const std::string&, int64_t)> walk =
      [&](const torch::nn::Module& m, const std::string& prefix, int64_t depth) {
        for (const auto& child : m.named_children()) {
          const std::string name = prefix.empty() ? child.key() : prefix + "." + child.key();
          rows.push_back({name, short_type(child.value()->name()), count(*child.value())});
          if (depth < max_depth) walk(*child.value(), name, depth + 1);
        }
      };
  if (max_depth > 0) walk(module, "", 1);
  int64_t trainable = 0, frozen = 0, bytes = 0;
  for (const auto& p : module.parameters()) {
    (p.requires_grad() ? trainable : frozen) += p.numel();
    bytes += p.numel() * static_cast<int64_t>(p.element_size());
  }
  size_t name_width = 4, type_width = 4;
  for (const auto& r : rows)
    name_width = std::max(name_width, r.name.size()), type_width = std::max(type_width, r.type.size());
  std::ostringstream out;
  const std::string header =
      fmt::format("  | {:<{}} | {:<{}} | {:>8}", "Name", name_width, "Type", type_width, "Params");
  out << header << "\n" << std::string(header.size(), '-') << "\n";
  for (size_t i = 0; i < rows.size(); ++i)
    out << fmt::format("{:<2}| {:<{}} | {:<{}} | {:>8}\n", i, rows[i].name, name_width, rows[i].type, type_width,
                       rows[i].params);
  out << std::string(header.size(), '-') << "\n";
  out << fmt::format("{:<10}Trainable params\n", trainable);
  out << fmt::format("{:<10}Non-trainable params\n", frozen);
  out << fmt::format("{:<10}Total params\n", trainable + frozen);
  out << fmt::format("{:<10.3f}Total estimated model params size (MB)\n", static_cast<double>(bytes) / 1e6);
  return out.str();
}

void ModelSummary::on_fit_start(Trainer&, ModuleBase& module) {
  (out_ ? *out_ : std::cout) << summarize(module, max_depth_) << std::flush;
}

}  // namespace fulgor

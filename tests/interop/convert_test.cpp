// fulgor-convert, run as a user runs it, between Python's files and back.

#include <fmt/format.h>
#include <fulgor/checkpoint/checkpoint.h>
#include <fulgor/interop/distributed_checkpoint.h>
#include <fulgor/interop/safetensors.h>
#include <fulgor/interop/torch_load.h>
#include <fulgor/interop/weights_file.h>

#include <sys/stat.h>

#include <fstream>
#include <sstream>

#include "interop_support.h"

namespace fulgor::interop_test {
namespace {

int run(const std::string& command, std::string* output) {
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  char buffer[4096];
  output->clear();
  while (size_t n = fread(buffer, 1, sizeof buffer, pipe)) output->append(buffer, n);
  int status = pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

int convert(const std::string& arguments, std::string* output) {
  return run(std::string(FULGOR_CONVERT) + " " + arguments, output);
}

// Values, dtypes and shapes as Python described them (a conversion makes
// views contiguous).
void expect_values(const StateDict& state, const nlohmann::json& want) {
  ASSERT_EQ(state.size(), want.size());
  for (const auto& [name, w] : want.items()) {
    SCOPED_TRACE(name);
    ASSERT_NE(state.find(name), nullptr);
    EXPECT_EQ(dtype_name(state[name].scalar_type()), w["dtype"].get<std::string>());
    EXPECT_EQ(state[name].sizes().vec(), w["shape"].get<std::vector<int64_t>>());
    EXPECT_EQ(hex_of(state[name]), w["hex"].get<std::string>());
  }
}

TEST(FulgorConvert, TorchSaveToSafetensorsAndBackForPython) {
  ScratchDir dir("convert_round");
  std::string output;
  auto st = dir.path() / "sd.safetensors";
  ASSERT_EQ(convert(fmt::format("{} {}", (reference_dir() / "state_dict.pt").string(), st.string()), &output), 0) << output;
  EXPECT_NE(output.find("(torch.save)"), std::string::npos) << output;
  expect_values(read_safetensors(st).tensors, expected()["state_dict"]);

  auto pt = dir.path() / "back.pt";
  ASSERT_EQ(convert(fmt::format("{} {}", (reference_dir() / "tensors.safetensors").string(), pt.string()), &output), 0)
      << output;
  EXPECT_NE(output.find("(safetensors)"), std::string::npos) << output;
  EXPECT_EQ(run_python(fmt::format("{}/torch_files.py check {} {} safetensors", FULGOR_INTEROP_SCRIPTS, pt.string(),
                                   (reference_dir() / "expected.json").string()),
                       &output),
            0)
      << output;
}

TEST(FulgorConvert, ReadsLightningAndFulgorCheckpoints) {
  ScratchDir dir("convert_checkpoints");
  std::string output;
  ASSERT_EQ(convert(fmt::format("{} {}", (reference_dir() / "net.ckpt").string(), (dir.path() / "n.pt").string()),
                    &output),
            0)
      << output;
  EXPECT_NE(output.find("(Lightning checkpoint)"), std::string::npos) << output;
  StateDict lightning = read_weights(dir.path() / "n.pt");
  EXPECT_NE(lightning.find("model.1.running_mean"), nullptr);

  // A fulgor checkpoint's model archive, nested by submodule.
  auto net = torch::nn::Sequential(torch::nn::Linear(4, 8), torch::nn::BatchNorm1d(8));
  torch::serialize::OutputArchive archive, model;
  net->save(model);
  archive.write("model", model);
  write_checkpoint_file((dir.path() / "f.ckpt").string(), archive);
  ASSERT_EQ(convert(fmt::format("{} {}", (dir.path() / "f.ckpt").string(), (dir.path() / "f.safetensors").string()),
                    &output),
            0)
      << output;
  EXPECT_NE(output.find("(fulgor checkpoint)"), std::string::npos) << output;
  StateDict converted = read_safetensors(dir.path() / "f.safetensors").tensors;
  for (const auto& p : net->named_parameters()) EXPECT_TRUE(torch::equal(converted[p.key()], p.value())) << p.key();
  for (const auto& b : net->named_buffers()) EXPECT_TRUE(torch::equal(converted[b.key()], b.value())) << b.key();
  EXPECT_EQ(converted.size(), net->named_parameters().size() + net->named_buffers().size());
}

TEST(FulgorConvert, ListsNamesDtypesShapesAndChecksumsXxhsumAgreesWith) {
  ScratchDir dir("convert_list");
  std::string output;
  ASSERT_EQ(convert("--list --checksum " + (reference_dir() / "state_dict.pt").string(), &output), 0) << output;
  StateDict state = read_weights(reference_dir() / "state_dict.pt");
  const torch::Tensor& t = state["sliced"];
  torch::Tensor c = t.contiguous();
  std::ofstream(dir.path() / "bytes", std::ios::binary).write(static_cast<const char*>(c.data_ptr()), c.nbytes());
  std::string hash;
  ASSERT_EQ(run("xxhsum -H3 " + (dir.path() / "bytes").string(), &hash), 0) << hash;
  // "XXH3 (FILE) = HASH" (BSD style) or "[XXH3_]HASH  FILE", by xxhsum's version.
  std::string digits = hash.find(" = ") != std::string::npos ? hash.substr(hash.find(" = ") + 3, 16)
                       : hash.rfind("XXH3_", 0) == 0       ? hash.substr(5, 16)
                                                            : hash.substr(0, 16);
  EXPECT_NE(output.find("sliced\tFloat\t[3, 3]\t" + digits), std::string::npos) << output << hash;
  EXPECT_NE(output.find("bfloat16\tBFloat16\t[2, 3, 4]\t"), std::string::npos) << output;

  EXPECT_EQ(convert(fmt::format("{} {}", (reference_dir() / "state_dict.pt").string(), (dir.path() / "x.onnx").string()),
                    &output),
            1);
  EXPECT_NE(output.find("accepted: .safetensors, .pt, .pth, .bin"), std::string::npos) << output;
  EXPECT_EQ(convert("--list", &output), 2);
}

// A file of `n` int16 tensors "t0" ... of one element each, t<i> holding i
// (its low 16 bits), its header listing them in the reverse of their data's
// order.
fs::path many_tensors(const ScratchDir& dir, int n) {
  std::string header = "{";
  for (int i = n - 1; i >= 0; --i)
    header += fmt::format(R"("t{}":{{"dtype":"I16","shape":[1],"data_offsets":[{},{}]}}{})", i, 2 * i, 2 * i + 2,
                          i > 0 ? "," : "}");
  header.append((8 - header.size() % 8) % 8, ' ');
  const fs::path path = dir.path() / "many.safetensors";
  std::ofstream out(path, std::ios::binary);
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>(header.size() >> (8 * i)));
  out << header;
  for (int i = 0; i < n; ++i) out.put(static_cast<char>(i & 0xff)).put(static_cast<char>((i >> 8) & 0xff));
  return path;
}

// Listing 100,000 tensors once took 140 s: their header's parse scanned every
// tensor before each one. In time linear in the header it takes a fraction of
// a second; quadratic, minutes, which `timeout` ends as a failure (status 124).
TEST(FulgorConvert, ListsAHundredThousandTensorsInTheOrderOfTheirData) {
  ScratchDir dir("convert_many");
  constexpr int n = 100'000;
  const fs::path path = many_tensors(dir, n);
  std::string output;
  ASSERT_EQ(run(fmt::format("timeout 60 {} --list {}", FULGOR_CONVERT, path.string()), &output), 0)
      << output.substr(0, 1000);
  std::istringstream lines(output);
  std::string line;
  std::getline(lines, line);
  EXPECT_EQ(line, fmt::format("# {}: safetensors, {} tensors", path.string(), n));
  int listed = 0;
  for (; std::getline(lines, line); ++listed)
    if (line != fmt::format("t{}\tShort\t[1]", listed)) break;
  EXPECT_EQ(listed, n) << "line " << listed + 2 << ": " << line;
  StateDict state = read_weights(path);
  ASSERT_EQ(state.size(), static_cast<size_t>(n));
  for (int i : {0, 255, 256, 12'345, 40'000, n - 1})  // i's low 16 bits, as int16
    EXPECT_EQ(state[fmt::format("t{}", i)].item<int64_t>(), static_cast<int16_t>(i));
}

// A FIFO once made --list wait for a writer forever; a device never ends.
// `timeout` makes such a wait fail the test (status 124) rather than hang it.
TEST(FulgorConvert, RefusesAFifoOrADeviceAsInputOrOutputWithoutWaiting) {
  ScratchDir dir("convert_fifo");
  const std::string fifo = (dir.path() / "in.safetensors").string(), out = (dir.path() / "out.pt").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  ASSERT_EQ(::mkfifo(out.c_str(), 0600), 0);
  const std::string timed = "timeout 60 " + std::string(FULGOR_CONVERT);
  std::string output;
  EXPECT_EQ(run(fmt::format("{} --list {}", timed, fifo), &output), 1) << output;
  EXPECT_NE(output.find("weights file '" + fifo + "' is a FIFO, not a regular file"), std::string::npos) << output;
  EXPECT_EQ(run(fmt::format("{} {} {}", timed, fifo, (dir.path() / "x.pt").string()), &output), 1) << output;
  EXPECT_NE(output.find("'" + fifo + "' is a FIFO, not a regular file"), std::string::npos) << output;
  EXPECT_EQ(run(fmt::format("{} --list /dev/zero", timed), &output), 1) << output;
  EXPECT_NE(output.find("'/dev/zero' is a character device, not a regular file"), std::string::npos) << output;
  // An output that is no regular file would be replaced by the rename that ends a write.
  const std::string source = (reference_dir() / "state_dict.pt").string();
  EXPECT_EQ(run(fmt::format("{} {} {}", timed, source, out), &output), 1) << output;
  EXPECT_NE(output.find("cannot write '" + out + "': it is a FIFO, not a regular file"), std::string::npos) << output;
  EXPECT_TRUE(fs::is_fifo(out));
  EXPECT_FALSE(fs::exists(dir.path() / "x.pt"));
}

// PyTorch's 2-rank folder to safetensors, a torch.save state dict to a
// folder, and the folder listed.
TEST(FulgorConvert, DistributedCheckpointsToFilesAndBack) {
  ScratchDir dir("convert_dcp");
  std::string output;
  auto st = dir.path() / "from_dcp.safetensors";
  ASSERT_EQ(convert(fmt::format("{} {}", (reference_dir() / "dcp_two").string(), st.string()), &output), 0) << output;
  EXPECT_NE(output.find("(distributed checkpoint)"), std::string::npos) << output;
  StateDict tensors = read_safetensors(st).tensors;
  size_t compared = 0;
  for (const auto& entry : flatten_state_dict(torch_load(reference_dir() / "dcp_expected.pt"))) {
    if (!entry.value.isTensor()) continue;
    ASSERT_NE(tensors.find(entry.fqn()), nullptr) << entry.fqn();
    EXPECT_TRUE(torch::equal(tensors[entry.fqn()], entry.value.toTensor())) << entry.fqn();
    ++compared;
  }
  EXPECT_EQ(compared, tensors.size());

  auto folder = dir.path() / "sd_dcp";
  ASSERT_EQ(convert(fmt::format("{} {}/", (reference_dir() / "state_dict.pt").string(), folder.string()), &output), 0)
      << output;
  StateDict saved = read_weights(reference_dir() / "state_dict.pt");
  auto back = read_distributed_checkpoint(folder).toGenericDict();
  ASSERT_EQ(back.size(), saved.size());
  for (const auto& entry : saved) EXPECT_TRUE(torch::equal(back.at(entry.key()).toTensor(), entry.value()));
  ASSERT_EQ(convert(fmt::format("--list {}", folder.string()), &output), 0) << output;
  EXPECT_NE(output.find(fmt::format(": distributed checkpoint, {} tensors", saved.size())), std::string::npos) << output;
}

}  // namespace
}  // namespace fulgor::interop_test

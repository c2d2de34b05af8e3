// Writes the TorchScript model that fortran_train trains, from C++ with
// LibTorch alone (make_model.py writes the same network from Python):
//
//   make_model model.pt
//
// an MLP of 4 inputs, 16 tanh units and 1 output, its layers initialised as
// torch::nn::Linear (and Python's nn.Linear) initialise them.
#include <torch/script.h>
#include <torch/torch.h>

#include <cstdio>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_model MODEL.pt\n");
    return 2;
  }
  torch::manual_seed(0);
  torch::nn::Linear hidden(4, 16), out(16, 1);
  torch::jit::Module model("Net");
  // What a scripted nn.Module holds: its mode, and parameters that require grad.
  model.register_attribute("training", c10::BoolType::get(), true);
  const auto parameter = [](const torch::Tensor& t) { return t.detach().clone().requires_grad_(); };
  model.register_parameter("hidden_weight", parameter(hidden->weight), false);
  model.register_parameter("hidden_bias", parameter(hidden->bias), false);
  model.register_parameter("out_weight", parameter(out->weight), false);
  model.register_parameter("out_bias", parameter(out->bias), false);
  model.define(R"(
def forward(self, x):
    return torch.linear(torch.tanh(torch.linear(x, self.hidden_weight, self.hidden_bias)), self.out_weight, self.out_bias)
)");
  model.save(argv[1]);
  std::printf("wrote %s\n", argv[1]);
  return 0;
}

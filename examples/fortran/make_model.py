# Writes the TorchScript model that fortran_train trains, from Python:
#
#   python3 make_model.py model.pt
#
# an MLP of 4 inputs, 16 tanh units and 1 output, scripted (torch.jit.trace
# of the network on an example batch works as well). Save it with a PyTorch no
# newer than the LibTorch fulgor runs on.
import sys

import torch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden = torch.nn.Linear(4, 16)
        self.out = torch.nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.hidden(x)))


if len(sys.argv) != 2:
    sys.exit("usage: make_model.py MODEL.pt")
torch.manual_seed(0)
torch.jit.script(Net()).save(sys.argv[1])

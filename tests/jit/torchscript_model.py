# The Python side of the TorchScript tests (python3-torch).
#
#   torchscript_model.py make DIR OUT.json
#       writes DIR/scripted.pt (torch.jit.script) and DIR/traced.pt
#       (torch.jit.trace) of one network, and its state_dict() keys to OUT.json
#   torchscript_model.py check DIR OUT.json
#       loads DIR/exported.pt into a fresh network with load_state_dict(strict=True)
#       and writes its eval-mode output on DIR/input.pt's tensor to OUT.json
import json
import sys

import torch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Tanh())
        self.head = torch.nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def main():
    mode, folder, out = sys.argv[1], sys.argv[2], sys.argv[3]
    torch.manual_seed(0)
    net = Net()
    if mode == "make":
        torch.jit.script(net).save(folder + "/scripted.pt")
        torch.jit.trace(net, torch.randn(5, 4)).save(folder + "/traced.pt")
        result = {"keys": list(net.state_dict().keys()), "torch": torch.__version__}
    else:
        net.load_state_dict(torch.load(folder + "/exported.pt"), strict=True)
        net.eval()
        x = torch.load(folder + "/input.pt")
        with torch.no_grad():
            result = {"output": net(x).reshape(-1).tolist()}
    with open(out, "w") as f:
        json.dump(result, f)


main()

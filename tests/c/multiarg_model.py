# The reference for tests/c/multiarg_test.c (python3-torch): a TorchScript
# model of two inputs and two outputs, a TorchScript loss of both outputs and
# two labels, and 20 steps of SGD with momentum in Python.
#
#   multiarg_model.py DIR
#
# writes DIR/model.pt, DIR/loss.pt, DIR/config.json (naming loss.pt relative
# to DIR), the data (x.bin, t.bin, u.bin, v.bin: float32, row-major), the
# losses of the 20 steps (losses.bin: float64) and the trained model's
# predictions (pred_u.bin, pred_v.bin: float32).
import json
import sys

import torch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(3, 8)
        self.b = torch.nn.Linear(2, 8)
        self.u = torch.nn.Linear(8, 2)
        self.v = torch.nn.Linear(8, 1)

    def forward(self, x: torch.Tensor, t: torch.Tensor):
        h = torch.tanh(self.a(x) + self.b(t))
        return self.u(h), self.v(h)


class Loss(torch.nn.Module):
    def forward(self, u: torch.Tensor, v: torch.Tensor, u_label: torch.Tensor, v_label: torch.Tensor):
        return torch.nn.functional.mse_loss(u, u_label) + 0.5 * torch.nn.functional.l1_loss(v, v_label)


def write(path, tensor):
    with open(path, "wb") as f:
        f.write(tensor.detach().contiguous().numpy().tobytes())


def main():
    folder = sys.argv[1]
    # The TensorExpr fuser stays off: with it, Debian's python3-torch 2.6
    # never finishes this model's fused backward on the CPU. The C API's
    # steps equal these bit for bit (on 1.13 the fuser changes nothing here).
    torch._C._jit_set_texpr_fuser_enabled(False)
    torch.manual_seed(0)
    torch.jit.script(Net()).save(folder + "/model.pt")
    torch.jit.script(Loss()).save(folder + "/loss.pt")
    with open(folder + "/config.json", "w") as f:
        json.dump({"accelerator": "cpu", "loss": {"type": "torchscript", "path": "loss.pt"},
                   "optimizer": {"type": "sgd", "lr": 0.05, "momentum": 0.9}}, f)
    rows = 16
    x, t = torch.randn(rows, 3), torch.randn(rows, 2)
    u = torch.stack([x[:, 0] - t[:, 1], x[:, 1] * t[:, 0]], dim=1)
    v = (x[:, 2] + t[:, 0]).unsqueeze(1)
    for name, tensor in (("x", x), ("t", t), ("u", u), ("v", v)):
        write(f"{folder}/{name}.bin", tensor)
    # The saved files, loaded back as the C API loads them.
    net, loss_fn = torch.jit.load(folder + "/model.pt"), torch.jit.load(folder + "/loss.pt")
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for _ in range(20):
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(*net(x, t), u, v)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    write(folder + "/losses.bin", torch.tensor(losses, dtype=torch.float64))
    net.eval()
    with torch.no_grad():
        pred_u, pred_v = net(x, t)
    write(folder + "/pred_u.bin", pred_u)
    write(folder + "/pred_v.bin", pred_v)


main()

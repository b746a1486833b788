#!/usr/bin/python3
"""Records torch.optim.AdamW on three small parameters for tests/train/test_train_optim.cpp.

Run with Debian's python3-torch (1.13): /usr/bin/python3 tests/reference/make_adamw_fixture.py
Writes tests/reference/adamw.json next to this script.

Parameters: "w" [3,4] and "e" [2,3,2] with weight decay, "b" [5] without (its own param group,
weight_decay 0). Five steps, each with its own fixed gradients and its own learning rate (set on
the param groups before the step, as a schedule would). Gradient scales vary per step and one
step feeds tiny gradients (~1e-8) so eps matters. All numbers are float32 values written as
exact decimals of their float64 widening.
"""
import json
import os

import torch

torch.manual_seed(20240611)
lr0, betas, eps, wd = 1e-2, (0.9, 0.95), 1e-8, 0.1
lrs = [1e-2, 2e-2, 5e-3, 3e-2, 1e-3]
grad_scales = [1.0, 0.3, 5.0, 1e-8, 0.7]

shapes = {"w": [3, 4], "b": [5], "e": [2, 3, 2]}
decay = {"w": True, "b": False, "e": True}
params = {n: torch.randn(*s, dtype=torch.float32).requires_grad_(True) for n, s in shapes.items()}
names = list(shapes)

opt = torch.optim.AdamW(
    [
        {"params": [params[n] for n in names if decay[n]], "weight_decay": wd},
        {"params": [params[n] for n in names if not decay[n]], "weight_decay": 0.0},
    ],
    lr=lr0, betas=betas, eps=eps, foreach=False)


def flat(t):
    return [float(x) for x in t.detach().reshape(-1).tolist()]


out = {
    "torch_version": torch.__version__,
    "betas": list(betas), "eps": eps, "weight_decay": wd, "lrs": lrs,
    "params": [{"name": n, "shape": shapes[n], "decay": decay[n], "init": flat(params[n])}
               for n in names],
    "steps": [],
}
for step, (lr, scale) in enumerate(zip(lrs, grad_scales)):
    grads = {n: (torch.randn(*shapes[n]) * scale).float() for n in names}
    for n in names:
        params[n].grad = grads[n].clone()
    for g in opt.param_groups:
        g["lr"] = lr
    opt.step()
    out["steps"].append({
        "lr": lr,
        "grads": {n: flat(grads[n]) for n in names},
        "params": {n: flat(params[n]) for n in names},
    })
out["final_state"] = {n: {"exp_avg": flat(opt.state[params[n]]["exp_avg"]),
                          "exp_avg_sq": flat(opt.state[params[n]]["exp_avg_sq"])} for n in names}

path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "adamw.json")
with open(path, "w") as f:
    json.dump(out, f, indent=1)
    f.write("\n")
print("wrote", path)

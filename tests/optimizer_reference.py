"""torch.optim's trajectories for the cases optimizer_test checks Summa's optimizers against.

  optimizer_reference.py --write tests/data/optimizer_reference.txt   record them (needs torch)
  optimizer_reference.py --check tests/data/optimizer_reference.txt   recompute and compare

Every case starts from the same 8 weights and takes STEPS updates from gradients with exact
float32 values (small multiples of 1/8), so Summa's C++ test rebuilds the same inputs from the
formulas below. The file holds, per case, a line `case NAME key=value ...` and one line
`step T w0 ... w7` per update, each weight printed with 9 significant digits (exact in float32).
--check exits 77 (ctest's skip) where torch is not installed."""
import argparse
import os
import sys

STEPS = 12
N = 8

CASES = [
    ("sgd", dict(optimizer="sgd", lr=0.1)),
    ("sgd_weight_decay", dict(optimizer="sgd", lr=0.1, weight_decay=0.05)),
    ("sgd_momentum", dict(optimizer="sgd", lr=0.05, momentum=0.9, weight_decay=0.01)),
    ("sgd_nesterov", dict(optimizer="sgd", lr=0.05, momentum=0.8, nesterov=1)),
    ("adam", dict(optimizer="adam", lr=0.01)),
    ("adam_weight_decay", dict(optimizer="adam", lr=0.02, weight_decay=0.1, beta1=0.8, beta2=0.99)),
    ("adamw", dict(optimizer="adamw", lr=0.01, weight_decay=0.1)),
]


def initial(i):
    return 0.5 - 0.125 * i


def gradient(t, i):
    # The mean gradient of update t; Summa receives 4x this as a sum over 4 examples.
    return (((i * 7 + t * 13) % 17) - 8) / 8.0


def trajectory(name, cfg):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_default_dtype(torch.float32)
    w = torch.nn.Parameter(torch.tensor([initial(i) for i in range(N)], dtype=torch.float32))
    kind = cfg["optimizer"]
    if kind == "sgd":
        opt = torch.optim.SGD([w], lr=cfg["lr"], momentum=cfg.get("momentum", 0.0),
                              nesterov=bool(cfg.get("nesterov", 0)),
                              weight_decay=cfg.get("weight_decay", 0.0))
    else:
        cls = torch.optim.Adam if kind == "adam" else torch.optim.AdamW
        opt = cls([w], lr=cfg["lr"], betas=(cfg.get("beta1", 0.9), cfg.get("beta2", 0.999)),
                  eps=cfg.get("eps", 1e-8), weight_decay=cfg.get("weight_decay", 0.0 if kind == "adam" else 0.01))
    rows = []
    for t in range(STEPS):
        w.grad = torch.tensor([gradient(t, i) for i in range(N)], dtype=torch.float32)
        opt.step()
        rows.append([float(x) for x in w.detach()])
    return rows


def render():
    lines = []
    for name, cfg in CASES:
        lines.append("case %s %s" % (name, " ".join("%s=%s" % kv for kv in cfg.items())))
        for t, row in enumerate(trajectory(name, cfg)):
            lines.append("step %d %s" % (t, " ".join("%.9g" % x for x in row)))
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser()
    group = ap.add_mutually_exclusive_group(required=True)
    group.add_argument("--write")
    group.add_argument("--check")
    args = ap.parse_args()
    try:
        import torch  # noqa: F401
    except ImportError:
        print("torch is not installed: the recorded values stand (scripts/setup.sh --bench installs it)")
        return 77
    text = render()
    if args.write:
        with open(args.write, "w") as f:
            f.write(text)
        return 0
    with open(args.check) as f:
        recorded = f.read()
    if recorded != text:
        print("torch.optim's trajectories differ from the recorded ones in %s:" % args.check)
        for a, b in zip(recorded.splitlines(), text.splitlines()):
            if a != b:
                print("  recorded: %s\n  torch:    %s" % (a, b))
        return 1
    print("the recorded trajectories match torch %s" % __import__("torch").__version__)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A tour of qkv from Python: train a tiny model, sample from it, check its gradients, compare the two
numerics modes and look at an attention map.

Run it top to bottom with the built module on the path, by the interpreter the module was built for
(from the repository root):

    PYTHONPATH=build/python python3 examples/python_tour.py --out python_tour_out

or cell by cell (`# %%` marks a cell) in an editor that runs such cells (VS Code, Spyder, Jupytext).
It writes loss.png, consistency.png, attention.png and the training run (run/) into --out. Every check
raises when it does not hold, so the exit status says whether the tour's claims held; --json ends the
output with one JSON line of the numbers shown.
"""

# %% Setup
# The corpus path in configs/tiny.toml is relative to the repository root; the tour passes it as an
# absolute path so that it runs from any directory.
import argparse
import json
import pathlib
import time

# qkv before numpy: numpy's OpenBLAS loads libgomp, and qkv sets libgomp's wait policy (for busy
# cores) only when it is the first to load it.
import qkv
import matplotlib

matplotlib.use("Agg")  # files only, no window
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "tiny.toml"
CORPUS = REPO / "data" / "corpus" / "tinyshakespeare.txt"

parser = argparse.ArgumentParser(description="A tour of qkv from Python (see the file's docstring).")
parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("python_tour_out"),
                    help="output directory (default: ./python_tour_out)")
parser.add_argument("--steps", type=int, default=200, help="training steps (default: 200, about a second)")
parser.add_argument("--json", action="store_true", help="end with one JSON line of the results")
args = parser.parse_args()
if args.steps < 2:
    parser.error("--steps must be >= 2 (the tour compares the first loss with the last)")
out = args.out.resolve()
out.mkdir(parents=True, exist_ok=True)
started = time.perf_counter()


def require(ok, what):
    """One claim of the tour: printed when it holds, raised when it does not."""
    if not ok:
        raise RuntimeError(f"check failed: {what}")
    print(f"  ok: {what}")


# %% 1. Train a tiny model, watching the loss as it goes
# qkv.train runs what `qkv train` runs. Overrides are the CLI's --set strings; the callback receives
# each logged step's metrics (a dict) while training runs, and returning False from it would stop the
# run with a checkpoint. log_interval=1 logs every step.
print(f"== training configs/tiny.toml for {args.steps} steps into {out / 'run'}")
train_loss = {}  # step -> training loss
val_loss = {}  # step -> validation loss (every train.eval_interval steps)


def on_log(metrics):
    train_loss[metrics["step"]] = metrics["loss"]
    if "val_loss" in metrics:
        val_loss[metrics["step"]] = metrics["val_loss"]
    if metrics["step"] % 50 == 0 or metrics["step"] == 1:
        print(f"  step {metrics['step']:4d}  loss {metrics['loss']:.4f}  lr {metrics['lr']:.2e}")


summary = qkv.train(CONFIG, overrides=[f"train.max_steps={args.steps}", "train.log_interval=1",
                                       f"data.path={json.dumps(str(CORPUS))}"],
                    callback=on_log, out_dir=str(out / "run"), overwrite=True)
print(f"  {summary['step']} steps in {summary['seconds']:.2f} s, checkpoint {summary['checkpoint']}")

steps = sorted(train_loss)
first_loss, final_loss = train_loss[steps[0]], train_loss[steps[-1]]
require(steps == list(range(1, args.steps + 1)), "the callback saw every step")
require(final_loss < first_loss, f"the loss fell: {first_loss:.4f} -> {final_loss:.4f}")

fig, ax = plt.subplots(figsize=(6, 3.5))
ax.plot(steps, [train_loss[s] for s in steps], label="train (each step)")
ax.plot(sorted(val_loss), [val_loss[s] for s in sorted(val_loss)], "o-", label="validation")
ax.set(xlabel="step", ylabel="cross-entropy (nats)", title="tiny.toml on tinyshakespeare")
ax.legend()
fig.tight_layout()
fig.savefig(out / "loss.png", dpi=100)
plt.close(fig)

# %% 2. Load the checkpoint and sample from it
# qkv.load reads the checkpoint (config, weights, tokenizer). numerics="invariant" runs every kernel
# with a fixed reduction order whatever the batch, padding or cache, which makes the sampler's
# log-probabilities those the training loss computes, bit for bit.
model = qkv.load(summary["checkpoint"], numerics="invariant")
print(f"== {model}")
prompt = "JULIET:\nO Romeo, "
ids = model.tokenizer.encode(prompt)
# Greedy decoding (temperature 0) of a model this small soon repeats itself; the draw below is livelier.
greedy = model.generate(ids, max_new_tokens=24, temperature=0)
print(f"  greedy: {prompt + model.tokenizer.decode(greedy)!r}")

# A seeded draw at the checkpoint's temperature, scored again by the trainer's kernel
# (token_logprobs, as `qkv eval --per-token`). Prompt + draw fit one block, so both see the same context.
new_tokens = model.block_size - len(ids)
drawn, sampled_lp = model.generate(ids, max_new_tokens=new_tokens, seed=7, logprobs=True)
print(f"  drawn:  {prompt + model.tokenizer.decode(drawn)!r}")
scored_lp = model.token_logprobs(ids + drawn)[-len(drawn):]
require(np.array_equal(sampled_lp, scored_lp),
        f"invariant: the sampler's {len(drawn)} log-probs equal the trainer's bit for bit")

# The same under numerics="standard" (kernels tuned per shape): close, not guaranteed equal.
standard = qkv.load(summary["checkpoint"], numerics="standard")
std_drawn, std_lp = standard.generate(ids, max_new_tokens=new_tokens, seed=7, logprobs=True)
std_gap = float(np.max(np.abs(std_lp - standard.token_logprobs(ids + std_drawn)[-len(std_drawn):])))
print(f"  standard: sampler vs trainer max |diff| {std_gap:.3g}")

# %% 3. Gradient checks: the hand-written backward against central differences in float64
# gradcheck_attention perturbs q, k and v of one attention call; Model.gradcheck builds this model's
# config afresh in float64 and checks the whole network's gradient along random directions and at
# sampled parameter elements.
print("== gradient checks")
rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((1, 2, 6, 8)) for _ in range(3))  # float64 [batch, heads, tokens, dim]
attn_check = qkv.gradcheck_attention(q, k, v, causal=True)
print(f"  attention {attn_check['case']}, causal: max abs err {attn_check['max_abs_err']:.2e}")
require(attn_check["pass"], "the causal attention backward matches central differences")

model_check = model.gradcheck(directions=2, elements=2)
model_err = max([p["max_abs_err"] for p in model_check["params"]] + [d["abs_err"] for d in model_check["directions"]])
print(f"  model: {model_check['parameters']} parameters in {model_check['parameter_tensors']} tensors, "
      f"{len(model_check['directions'])} directions, max abs err {model_err:.2e}")
require(model_check["pass"], "the whole model's gradient matches central differences")

# %% 4. Consistency study: the same logits computed different ways
# Each check computes one model's logits two ways that should agree (cached decode vs a full forward,
# padded vs unpadded, one batch vs another, ...) and reports the largest |Δlogit|. Under "standard"
# the gaps are float32 rounding; under "invariant" they are exactly 0.
print("== consistency: max |Δlogit| per check")
consistency = qkv.consistency(model)
print(f"  {'check':<20} {'standard':>10} {'invariant':>10}")
for name, row in consistency.items():
    print(f"  {name:<20} {row['standard']['max_abs_delta']:>10.3g} {row['invariant']['max_abs_delta']:>10.3g}")
require(all(row["invariant"]["max_abs_delta"] == 0.0 for row in consistency.values()),
        "every invariant gap is exactly 0")
require(all(row["standard"]["pass"] for row in consistency.values()),
        "every standard gap is within its float32 rounding bound")

fig, ax = plt.subplots(figsize=(8, 3.5))
for name, row in consistency.items():
    ax.plot(row["standard"]["per_position"], marker=".", label=name)
ax.set(xlabel="position", ylabel="|Δlogit|", title="standard numerics: gaps by position (invariant: all 0)")
ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
fig.tight_layout()
fig.savefig(out / "consistency.png", dpi=100)
plt.close(fig)

# %% 5. An attention map
# attention_map returns the softmax weights as numpy: [tokens, tokens] for one layer and head, a row
# per query. Causal attention puts no weight on later tokens, and each row is a distribution.
text = "ROMEO: But soft, what light"
weights = qkv.attention_map(model, text, layer=0, head=0)
labels = [model.tokenizer.decode([i]).replace(" ", "\u2423").replace("\n", "\u21b5") for i in
          model.tokenizer.encode(text)]
print(f"== attention map, layer 0 head 0: {weights.shape} {weights.dtype}")
row_sum_err = float(np.max(np.abs(weights.sum(axis=1) - 1)))
require(row_sum_err < 1e-5, f"every row sums to 1 (max |sum - 1| {row_sum_err:.1e})")
require(not np.triu(weights, k=1).any(), "no weight on later tokens")

fig, ax = plt.subplots(figsize=(6, 5))
image = ax.imshow(weights, cmap="viridis", vmin=0, vmax=1)
fig.colorbar(image, ax=ax, shrink=0.8)
ax.set_xticks(range(len(labels)), labels, fontsize=7)
ax.set_yticks(range(len(labels)), labels, fontsize=7)
ax.set(xlabel="key", ylabel="query", title="layer 0, head 0")
fig.tight_layout()
fig.savefig(out / "attention.png", dpi=100)
plt.close(fig)

# %% 6. numpy interop: shared memory, not copies
# Model.logits returns a qkv.Tensor; np.asarray gives a view of the same memory. The other way,
# qkv.tensor(array) borrows the array's memory, so a write through either side shows in the other.
print("== numpy interop")
text_ids = np.array(model.tokenizer.encode(text), dtype=np.int64)
logits_tensor = model.logits(text_ids)  # [1, tokens, vocab]
logits = np.asarray(logits_tensor)
require(logits.ctypes.data == logits_tensor.data_ptr(), f"np.asarray(logits) {logits.shape} shares the tensor")

# log-softmax in numpy (float64) from those logits gives the log-probs the model scores the text with.
z = logits[0, :-1].astype(np.float64)
log_softmax = z - z.max(axis=1, keepdims=True)
log_softmax -= np.log(np.exp(log_softmax).sum(axis=1, keepdims=True))
numpy_lp = log_softmax[np.arange(len(text_ids) - 1), text_ids[1:]]
lp_gap = float(np.max(np.abs(numpy_lp - model.token_logprobs(text_ids))))
require(lp_gap < 1e-5, f"numpy's log-softmax of the logits matches token_logprobs (max |diff| {lp_gap:.1e})")

array = np.zeros(4, dtype=np.float32)
borrowed = qkv.tensor(array)
array[0] = 1.5
require(borrowed.tolist()[0] == 1.5, "qkv.tensor(array) sees a later write to the array")

# %% Summary
seconds = time.perf_counter() - started
results = {
    "steps": args.steps,
    "first_loss": first_loss,
    "final_loss": final_loss,
    "final_val_loss": summary["val_loss"],
    "checkpoint": summary["checkpoint"],
    "prompt": prompt,
    "greedy": model.tokenizer.decode(greedy),
    "greedy_tokens": len(greedy),
    "sampler_equals_trainer": bool(np.array_equal(sampled_lp, scored_lp)),
    "sampled_tokens": len(drawn),
    "standard_sampler_gap": std_gap,
    "attention_gradcheck": {"pass": attn_check["pass"], "max_abs_err": attn_check["max_abs_err"]},
    "model_gradcheck": {"pass": model_check["pass"], "max_abs_err": model_err},
    "consistency": {name: {"standard": row["standard"]["max_abs_delta"],
                           "invariant": row["invariant"]["max_abs_delta"]} for name, row in consistency.items()},
    "attention_row_sum_err": row_sum_err,
    "logprob_numpy_gap": lp_gap,
    "plots": [str(out / name) for name in ("loss.png", "consistency.png", "attention.png")],
    "seconds": seconds,
}
print(f"tour done in {seconds:.1f} s: loss {first_loss:.3f} -> {final_loss:.3f}, sampler = trainer, gradients ok, "
      f"invariant gaps 0, plots in {out}")
if args.json:
    print(json.dumps({"summary": results}))

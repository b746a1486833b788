#include "train/trainer.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#ifdef QKV_WITH_CUDA
#include "attention/cuda/mma_attention.h"
#endif
#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/functions.h"
#include "data/h5.h"
#include "data/input_file.h"
#include "distributed/distributed.h"
#include "distributed/nccl.h"
#include "tensor/cpu/gemm/bf16_gemm.h"
#include "tensor/cuda/cuda_backend.h"
#include "train/checkpoint.h"
#include "train/clip.h"
#include "train/config_schema.h"
#include "train/evaluate.h"
#include "train/hf_interop.h"
#include "train/model_factory.h"
#include "train/row_step.h"
#include "train/run_log.h"
#include "train/atomic_file.h"
#include "train/schedule.h"
#include "train/session.h"

namespace qkv::train {
namespace {

using Clock = std::chrono::steady_clock;

std::string checkpoint_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "ckpt_%06lld.h5", static_cast<long long>(step));
  return buf;
}

bool every(int64_t interval, int64_t step) { return interval > 0 && step % interval == 0; }

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

BatcherOptions batcher_options(const Config& cfg, uint64_t seed, const dist::Communicator& comm,
                               int64_t micro_batches) {
  BatcherOptions o;
  o.rank = comm.rank();  // [dist] this rank's rows of the global batch
  o.world = comm.world();
  o.mode = cfg.data.batching;
  o.batch_size = cfg.train.batch_size;
  o.micro_batches = micro_batches;
  o.block_size = cfg.train.resolved_seq_len(cfg.model.block_size);
  o.seed = seed;
  o.padding = cfg.data.padding_side;
  return o;
}

// The run directory's lock (trainer.h): an exclusive flock on OUT_DIR/train.lock, held while
// the run writes there. The kernel drops it when the process ends however it ends (kill -9
// included), so a lock is never stale; the file itself stays, holding the last holder's pid.
class RunDirLock {
 public:
  explicit RunDirLock(const std::string& dir) {
    const std::string path = dir + "/" + kRunLockFile;
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    QKV_CHECK(fd_ >= 0, path, ": cannot open the run directory's lock file (", std::strerror(errno), ")");
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      char buf[32] = {};
      const ssize_t n = ::pread(fd_, buf, sizeof buf - 1, 0);
      ::close(fd_);
      std::string pid = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
      while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
      fd_ = -1;
      if (err == EWOULDBLOCK)
        fail(dir, ": another training run (pid ", pid.empty() ? "not yet recorded" : pid,
             ") is writing to this train.out_dir; wait for it to end or choose another train.out_dir");
      if (err == ENOLCK || err == EOPNOTSUPP || err == ENOSYS) {
        // A file system without locks must not stop training; the run just goes unguarded.
        std::fprintf(stderr, "qkv: warning: %s: cannot lock (%s); nothing stops another run from using %s\n",
                     path.c_str(), std::strerror(err), dir.c_str());
        return;
      }
      fail(path, ": cannot lock the run directory (", std::strerror(err), ")");
    }
    // Who holds it, for the message above (best effort: the lock itself is what excludes).
    const std::string pid = std::to_string(::getpid()) + "\n";
    if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
      // A lock file we cannot write still locks; only the holder's pid goes unrecorded.
    }
  }
  ~RunDirLock() {
    if (fd_ >= 0) ::close(fd_);  // closing the last descriptor releases the flock
  }
  RunDirLock(const RunDirLock&) = delete;
  RunDirLock& operator=(const RunDirLock&) = delete;

 private:
  int fd_ = -1;
};

// The corpus must be the one the checkpoint was trained on (not just one with the same vocabulary).
void check_same_corpus(const CheckpointMeta& meta, const CorpusFingerprint& now, const std::string& data_path,
                       bool warn) {
  if (!meta.state.corpus) {
    if (warn)
      std::fprintf(stderr,
                   "qkv: warning: %s records no corpus fingerprint (written by an older qkv): cannot check "
                   "that data.path is the corpus it was trained on\n",
                   meta.path.c_str());
    return;
  }
  const CorpusFingerprint& then = *meta.state.corpus;
  QKV_CHECK(then == now, meta.path, ": data.path (", data_path.empty() ? "random tokens" : data_path,
            ") is not the corpus of the run being resumed: ", now.tokens, " tokens with fingerprint ",
            std::to_string(now.fnv1a64), " now, ", then.tokens, " tokens with fingerprint ",
            std::to_string(then.fnv1a64), " in the checkpoint");
}

// [dist] Start-up agreement checks (collective; no-ops for one rank). Each ends the job with one
// message from rank 0 when the ranks differ (dist::check_same_on_all_ranks):
//   config: the resolved TOML (after --set) and the --resume / --init-from sources;
//   start:  the tokenizer, the split sizes and a sample of their tokens, the step, and the
//           parameters' bytes (every rank must start from the same weights).
void check_ranks_agree_on_config(dist::Communicator& comm, const Config& cfg, const std::string& resume,
                                 const std::string& init_from) {
  if (comm.world() == 1) return;
  const std::string text = to_toml(cfg);
  uint64_t h = h5::fnv1a64(text.data(), text.size());
  dist::check_same_on_all_ranks(comm, h, "the resolved config (--config and --set)");
  const std::string src = "resume=" + resume + "\ninit_from=" + init_from;
  h = h5::fnv1a64(src.data(), src.size());
  dist::check_same_on_all_ranks(comm, h, "--resume / --init-from");
}

void check_ranks_agree_on_start(dist::Communicator& comm, const RunData& data, const dist::DataParallel& dp,
                                int64_t step) {
  if (comm.world() == 1) return;
  const std::string tok = data.tokenizer->serialize();
  uint64_t h = h5::fnv1a64(tok.data(), tok.size());
  for (const TokenSplit* s : {data.train.get(), data.val.get()}) {
    if (!s) continue;
    const int64_t n = static_cast<int64_t>(s->tokens.size());
    h = h5::fnv1a64(&n, sizeof n, h);
    // Up to 65536 tokens at a fixed stride: enough to tell two corpora apart, cheap for big ones.
    const int64_t stride = std::max<int64_t>(1, n / 65536);
    for (int64_t i = 0; i < n; i += stride) h = h5::fnv1a64(&s->tokens[static_cast<size_t>(i)], sizeof(int32_t), h);
  }
  dist::check_same_on_all_ranks(comm, h, "the training data (tokenizer or token splits)");
  dist::check_same_on_all_ranks(comm, static_cast<uint64_t>(step), "the starting step");
  dist::check_same_on_all_ranks(comm, dp.parameter_hash(), "the starting parameters");
}

// [dist] load_run_data on rank 0 first, then on the others: preparing a text corpus writes a cache
// file beside it (data/dataset.h), which ranks must not race to create. Collective.
RunData load_run_data_rank0_first(dist::Communicator& comm, const Config& cfg) {
  if (comm.world() == 1) return load_run_data(cfg);
  RunData d;
  if (comm.is_root()) d = load_run_data(cfg);  // if this throws, the job aborts; nobody waits forever
  comm.barrier();
  if (!comm.is_root()) d = load_run_data(cfg);
  return d;
}

// What a step works on, for train_step.
struct StepContext {
  const Config& cfg;
  dist::Communicator& comm;
  nn::DecoderModel& model;
  dist::DataParallel& dp;  // gradient averaging over ranks (one process: plain zero_grad)
  AdamW& opt;              // over dp.optimizer_params()
  Batcher& batcher;
  const LrSchedule& schedule;
  const std::vector<Tensor>& params;
  uint64_t seed;
  int64_t masked_rows = 0;  // fully masked rows so far, this rank
};

struct StepResult {
  double loss = 0, grad_norm = 0, lr = 0;
  int64_t tokens = 0;  // this step's tokens, all ranks
};

// The step's micro-batches of this rank and the global batch's target count (the loss divisor:
// the mean is over every target of the G rows, not a mean of micro-batch means).
struct StepRows {
  std::vector<Batch> micro;
  int64_t global_targets = 0;
};

StepRows draw_step_rows(StepContext& c) {
  StepRows s;
  int64_t mine = 0;
  for (int64_t m = 0; m < c.cfg.train.grad_accum; ++m) {
    s.micro.push_back(c.batcher.next());
    mine += s.micro.back().n_targets;
  }
  s.global_targets = c.dp.distributed() ? c.comm.sum_ordered(mine) : mine;  // [dist]
  return s;
}

// The update from the step's gradient (every rank holds the same): its global norm, clipping
// folded into AdamW at the scheduled lr. A non-finite loss or norm skips the update (counted in
// state); train.max_bad_steps in a row ends the run.
void apply_update(StepContext& c, TrainState& state, StepResult& r) {
  r.grad_norm = global_grad_norm(c.params);
  r.lr = c.schedule.at(state.step);
  if (std::isfinite(r.loss) && std::isfinite(r.grad_norm)) {
    state.bad_steps_in_a_row = 0;
    const double clip = c.cfg.train.grad_clip;
    c.opt.step(r.lr, clip > 0 ? clip_scale(r.grad_norm, clip) : 1.0f);
    c.dp.gather_params();  // [dist] ZeRO-1: every rank's updated slice to every rank
  } else {
    // Skip: no update, counted; too many in a row ends the run rather than training on NaN.
    state.skipped_steps++;
    state.bad_steps_in_a_row++;
    if (c.comm.is_root())
      std::fprintf(stderr, "qkv: step %lld: non-finite %s, step skipped (%lld in a row)\n",
                   static_cast<long long>(state.step), std::isfinite(r.loss) ? "gradients" : "loss",
                   static_cast<long long>(state.bad_steps_in_a_row));
    QKV_CHECK(state.bad_steps_in_a_row < c.cfg.train.max_bad_steps, "training stopped: ", state.bad_steps_in_a_row,
              " non-finite steps in a row (train.max_bad_steps = ", c.cfg.train.max_bad_steps,
              "); lower train.lr or check the data");
  }
  if (!c.dp.flat_grads()) autograd::zero_grad(c.params);  // [dist] else the flat buffer stays bound
  state.step++;
  state.tokens_seen += r.tokens;
}

// One optimizer step, standard numerics: grad_accum micro-batches of forward, loss and backward,
// each micro-batch's mean loss weighted by its share of the global batch's targets; the mean
// gradient over ranks (bucketed all-reduce).
StepResult train_step_batched(StepContext& c, TrainState& state) {
  c.model.train();
  c.dp.zero_grads();
  StepRows rows = draw_step_rows(c);
  const double world = static_cast<double>(c.comm.world());
  double loss_sum = 0;
  int64_t tokens = 0;
  for (size_t micro = 0; micro < rows.micro.size(); ++micro) {
    const Batch& b = rows.micro[micro];
    // [dist] per-rank dropout keys (rank 0 keeps the run's seed).
    nn::RngContext rng{dist::rank_dropout_seed(c.seed, c.comm.rank()),
                       static_cast<uint64_t>(state.step * c.cfg.train.grad_accum + static_cast<int64_t>(micro)), 0};
    Tensor loss = batch_loss(c.model, b, rng, &c.masked_rows);
    // The share of the global batch's targets; reduce_grads divides by world.
    const double share =
        rows.global_targets > 0 ? static_cast<double>(b.n_targets) / static_cast<double>(rows.global_targets) : 0.0;
    loss_sum += share * loss.item();
    const double scale = share * world;
    if (micro + 1 == rows.micro.size()) c.dp.arm_overlap();  // [dist] gradients final in this backward
    autograd::backward(scale == 1.0 ? loss : ag::mul(loss, scale));
    tokens += b.x.numel();
  }
  // [dist] Mean gradients and the global batch's loss and token count on every rank.
  c.dp.reduce_grads();
  if (c.dp.distributed()) {
    loss_sum = c.comm.sum_ordered(loss_sum);
    tokens = c.comm.sum_ordered(tokens);
  }
  StepResult r{.loss = loss_sum, .tokens = tokens};
  apply_update(c, state, r);
  return r;
}

// One optimizer step, invariant numerics: every row of the rank's micro-batches runs forward and
// backward alone (its dropout keyed by its global row), its loss divided by the global batch's
// target count; the rows' gradients are summed in the row tree of their global indices
// (distributed/row_tree.h), on one process and across ranks alike; the logged loss adds the
// rows' losses in global row order. Every figure is then the same bits for every split of the G
// rows (docs/distributed.md).
StepResult train_step_rows(StepContext& c, TrainState& state) {
  c.model.train();
  c.dp.zero_grads();
  const StepRows rows = draw_step_rows(c);
  std::vector<double> row_loss =
      row_tree_backward(c.model, c.dp, rows.micro, rows.global_targets, c.seed, state.step, &c.masked_rows);
  int64_t tokens = 0;
  for (const Batch& b : rows.micro) tokens += b.x.numel();
  c.dp.reduce_grads();
  double loss = 0;
  if (c.dp.distributed()) {  // [dist] every rank's row losses, added in global row order
    std::vector<double> all(row_loss.size() * static_cast<size_t>(c.comm.world()));
    c.comm.allgather(row_loss.data(), all.data(), static_cast<int64_t>(row_loss.size() * sizeof(double)));
    for (double v : all) loss += v;
    tokens = c.comm.sum_ordered(tokens);
  } else {
    for (double v : row_loss) loss += v;
  }
  StepResult r{.loss = loss, .tokens = tokens};
  apply_update(c, state, r);
  return r;
}

StepResult train_step(StepContext& c, TrainState& state) {
  return c.dp.row_tree() ? train_step_rows(c, state) : train_step_batched(c, state);
}

// The first setting in which `theirs` (the network --init-from loads) computes another function
// than this run's model `ours`; dropout, init_std and attn_kernel (which change how it is trained
// or computed, not what) may differ.
std::optional<ConfigDifference> network_difference(const nn::ModelConfig& ours, nn::ModelConfig theirs) {
  theirs.dropout = ours.dropout;
  theirs.attn_dropout = ours.attn_dropout;
  theirs.init_std = ours.init_std;
  theirs.attn_kernel = ours.attn_kernel;
  return model_difference(ours, theirs);
}

// G of this run and of the checkpoint --resume continues: any split of the same G continues the
// run (bit for bit under invariant numerics); another G only when asked for. A checkpoint that
// predates global_batch_rows must have this run's batch_size and grad_accum.
void check_global_batch(const Config& cfg, const CheckpointMeta& meta, int world, const TrainOptions& opts) {
  const int64_t now = world * cfg.train.batch_size * cfg.train.grad_accum;
  const int64_t then = meta.state.global_batch_rows;
  if (then == 0) {
    const Config old = meta.config.resolved();
    if (const auto d = first_difference(old, cfg, {"train.batch_size", "train.grad_accum"}))
      fail(opts.resume, ": ", d->key, " is ", d->a, " in the run being resumed but ", d->b,
           " now (its checkpoint does not record the global batch, so batch_size and grad_accum must not change)");
    return;
  }
  if (then == now || opts.change_global_batch) return;
  fail(opts.resume, ": the global batch is ", then, " rows in the run being resumed but ", now, " now (", world,
       world == 1 ? " process" : " ranks", " x batch_size ", cfg.train.batch_size, " x grad_accum ",
       cfg.train.grad_accum, "); any split of ", then,
       " rows continues the run, or pass --change-global-batch to continue it with ", now);
}

// The state the run starts from: step 0 (fresh weights, or --init-from's), or --resume's
// checkpoint after checking it belongs to this run (settings, tokenizer, corpus), with its
// weights, optimizer state and batcher position loaded.
TrainState start_state(const Config& cfg, const TrainOptions& opts, const RunData& data,
                       const CorpusFingerprint& corpus, nn::DecoderModel& model, dist::DataParallel& dp, AdamW& opt,
                       Batcher& batcher) {
  TrainState state;
  state.seed = static_cast<uint64_t>(cfg.train.seed);
  state.batch_mode = cfg.data.batching;
  // --init-from: the weights' token ids must mean what the data's ids mean.
  const auto require_same_tokenizer = [&](const Tokenizer& theirs) {
    QKV_CHECK(theirs.serialize() == data.tokenizer->serialize(), opts.init_from, ": its tokenizer (", theirs.kind(),
              ", ", theirs.vocab_size(), " tokens) is not the one of data.path (", data.tokenizer->kind(), ", ",
              data.tokenizer->vocab_size(), " tokens); tokenize the text with `qkv prepare --tokenizer-from ",
              opts.init_from, "`");
  };
  if (!opts.resume.empty()) {
    CheckpointMeta meta = read_checkpoint_meta(opts.resume);
    check_resumable(cfg, model.config(), meta.config.resolved(), data.vocab_size, opts.resume);
    QKV_CHECK(meta.tokenizer->serialize() == data.tokenizer->serialize(), opts.resume,
              ": the checkpoint's tokenizer differs from the one built from data.path");
    check_same_corpus(meta, corpus, cfg.data.random_tokens ? "" : cfg.data.path, dp.comm().is_root());
    QKV_CHECK(meta.has_optimizer, opts.resume, ": has no optimizer state to resume from");
    check_global_batch(cfg, meta, dp.world(), opts);
    load_model_weights(opts.resume, model);
    load_optimizer_state(opts.resume, dp, opt);
    state = meta.state;
    if (meta.state.global_batch_rows == 0) state.data.step = state.step;  // counted micro-batches then
    batcher.restore(state.data);
  } else if (!opts.init_from.empty() && is_hf_directory(opts.init_from)) {
    // A Hugging Face directory (train/hf_interop.h): the network it describes must be this run's.
    const nn::ModelConfig theirs =
        model_config(read_hf_config(opts.init_from, cfg.data.tokenizer).config, data.vocab_size);
    if (const auto d = network_difference(model.config(), theirs))
      fail(opts.init_from, "/config.json: ", d->key, " is ", d->b, " there but ", d->a, " in this run's config");
    if (has_hf_tokenizer(opts.init_from)) require_same_tokenizer(*read_hf_tokenizer(opts.init_from));
    load_hf_weights(opts.init_from, model);
  } else if (!opts.init_from.empty()) {
    // A qkv checkpoint: the network its config describes must be this run's (its tensors fitting
    // this model is not enough: norm_eps, rope_theta, the position kind, the attention pattern ...
    // change the function without changing a shape).
    const CheckpointMeta meta = read_checkpoint_meta(opts.init_from);
    Config described = meta.config.resolved();
    if (described.model.vocab_size == 0) described.model.vocab_size = meta.tokenizer->vocab_size();
    if (const auto d = network_difference(model.config(), model_config(described, described.model.vocab_size)))
      fail(opts.init_from, ": ", d->key, " is ", d->b, " there but ", d->a, " in this run's config");
    require_same_tokenizer(*meta.tokenizer);
    load_model_weights(opts.init_from, model);
  }
  state.corpus = corpus;
  state.global_batch_rows = dp.world() * cfg.train.batch_size * cfg.train.grad_accum;
  return state;
}

// Nothing to train (--resume at or past train.max_steps): the checkpoint as it is (no loss was
// computed, so none is reported); the run directory is left untouched. Every rank returns alike.
TrainSummary nothing_to_do(const TrainState& state, const std::string& checkpoint, Clock::time_point t_start) {
  TrainSummary done;
  done.step = state.step;
  done.loss = NAN;
  done.best_val_loss = state.best_val_loss;
  done.skipped_steps = state.skipped_steps;
  done.checkpoint = checkpoint;
  done.nothing_to_do = true;
  done.seconds = std::chrono::duration<double>(Clock::now() - t_start).count();
  return done;
}

// A file a run writes to its out_dir: metrics.jsonl, best.h5, ckpt_<step>.h5, loss.svg, or the
// temporary of any of them (PATH.tmp.<pid>.<n>.<random>, train/atomic_file.h).
bool is_run_file(const std::string& name) {
  return name == "metrics.jsonl" || name == "best.h5" || name == "loss.svg" ||
         name.find(".tmp.") != std::string::npos || checkpoint_step(name).has_value();
}

std::vector<std::filesystem::path> run_files(const std::string& dir) {
  std::vector<std::filesystem::path> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    if (is_run_file(e.path().filename().string())) out.push_back(e.path());
  QKV_CHECK(!ec, dir, ": cannot list train.out_dir (", ec.message(), ")");
  return out;
}

// metrics.jsonl without the rows past `step` (and a last row a killed writer left half-written).
void truncate_metrics(const std::string& path, int64_t step) {
  // Only a regular file is a log to edit: anything else (a link to a device) is left to RunLog,
  // whose writes report it.
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return;
  std::istringstream in(read_input_file(path, kMetricsLogCap, "a run's metrics log"));
  std::string kept, line;
  bool dropped = false;
  while (std::getline(in, line)) {
    const nlohmann::json row = nlohmann::json::parse(line, nullptr, false);
    if (row.is_object() && row.contains("step") && row["step"].is_number_integer() &&
        row["step"].get<int64_t>() <= step)
      kept += line + "\n";
    else dropped = true;
  }
  if (dropped) write_file_atomic(path, kept);
}

// An out_dir belongs to one run (trainer.h). Rank 0, holding the directory's lock.
void claim_run_dir(const std::string& dir, const TrainOptions& opts, int64_t step) {
  const std::vector<std::filesystem::path> files = run_files(dir);
  std::error_code ec;
  const std::filesystem::path resume_dir = std::filesystem::path(opts.resume).parent_path();
  const bool continues_here =
      !opts.resume.empty() && std::filesystem::equivalent(resume_dir.empty() ? "." : resume_dir, dir, ec);
  if (continues_here) {
    // Left by a writer that was killed: temporaries and log rows past the checkpoint's step.
    for (const auto& f : files)
      if (f.filename().string().find(".tmp.") != std::string::npos) std::filesystem::remove(f, ec);
    truncate_metrics(dir + "/metrics.jsonl", step);
    return;
  }
  if (files.empty()) return;
  QKV_CHECK(opts.overwrite, dir, ": train.out_dir already holds a run (", files.front().filename().string(),
            "); continue it with --resume ", dir,
            "/ckpt_<step>.h5, choose another train.out_dir, or pass "
            "--overwrite to replace it");
  // --overwrite replaces the run's files, never an input of this run.
  if (!opts.init_from.empty())
    for (const auto& f : files)
      QKV_CHECK(!std::filesystem::equivalent(f, opts.init_from, ec), opts.init_from,
                ": --init-from is a file of train.out_dir ", dir,
                ", which --overwrite would delete; copy it elsewhere or choose another train.out_dir");
  for (const auto& f : files) {
    std::filesystem::remove(f, ec);
    QKV_CHECK(!ec, f.string(), ": cannot remove for --overwrite (", ec.message(), ")");
  }
}

}  // namespace

std::shared_ptr<const AdamW> full_optimizer_state(dist::DataParallel& dp, const AdamW& opt) {
  if (!dp.sharded()) return std::shared_ptr<const AdamW>(std::shared_ptr<const AdamW>(), &opt);  // not owned
  std::shared_ptr<AdamW> full;
  if (dp.comm().is_root()) {
    full = std::make_shared<AdamW>(dp.params(), opt.options());
    full->set_step_count(opt.step_count());
  }
  const dist::ElementState whole = full ? full->element_state() : dist::ElementState{};
  dp.gather_state(opt.element_state(), full ? &whole : nullptr, /*kinds: m, v*/ 2);
  return full;
}

void load_optimizer_state(const std::string& path, dist::DataParallel& dp, AdamW& opt) {
  if (!dp.sharded()) {
    load_optimizer_state(path, opt);
    return;
  }
  // Every rank reads the whole state (a transient full copy) and keeps its slice.
  AdamW full(dp.params(), opt.options());
  load_optimizer_state(path, full);
  dp.scatter_state(full.element_state(), opt.element_state());
  opt.set_step_count(full.step_count());
}

TensorCoreAttention::TensorCoreAttention([[maybe_unused]] bool on) {
#ifdef QKV_WITH_CUDA
  previous_ = attn::cuda_mma::enabled();
  attn::cuda_mma::set_enabled(previous_ && on);
#endif
}

TensorCoreAttention::~TensorCoreAttention() {
#ifdef QKV_WITH_CUDA
  attn::cuda_mma::set_enabled(previous_);
#endif
}

TrainSummary run_training(const Config& cfg_in, const TrainOptions& opts) {
  const Config cfg = cfg_in.resolved();
  const bool on_gpu = cfg.train.device == Device::cuda;
  // train.dtype = "bf16": matmuls and attention in bf16 (float32 accumulation) for every forward,
  // backward and evaluation of this run; weights, gradients and AdamW state stay float32.
  const autograd::AutocastGuard autocast(cfg.train.dtype == DType::bf16);
  const TensorCoreAttention tensor_cores(cfg.train.cuda_mma);
  const NumericsGuard numerics_mode(cfg.train.resolved_numerics());  // train.numerics for every forward of the run
  QKV_CHECK(opts.resume.empty() || opts.init_from.empty(), "--resume and --init-from are exclusive");
  apply_thread_setting(cfg);
  // [dist] One rank per process (dist::world(): MPI under mpirun, else one process); only rank 0
  // prints, writes metrics and checkpoints. Every rank must run the same config.
  dist::Communicator& comm = dist::world();
  const bool root = comm.is_root();
  check_ranks_agree_on_config(comm, cfg, opts.resume, opts.init_from);
  const auto t_start = Clock::now();

  RunData data = load_run_data_rank0_first(comm, cfg);  // [dist] rank 0 writes the prepared-data cache
  auto model = build_model(cfg, data.vocab_size, ModelUse::training);
  const uint64_t seed = static_cast<uint64_t>(cfg.train.seed);
  model->init_weights(seed);                     // on the CPU: the same initial weights whatever the device
  std::unique_ptr<dist::Communicator> gpu_comm;  // [dist] NCCL for the gradients, one rank per GPU
  if (on_gpu) {
    QKV_CHECK(cuda::device_count() > 0,
              "train.device = \"cuda\": no CUDA device is visible (or this build has no CUDA backend)");
    if (comm.world() > 1) gpu_comm = dist::make_nccl_gradients(comm);  // also selects this rank's GPU
    model->to(Device::cuda);  // before the optimizer, so its moments are allocated there
  }

  std::vector<OptimParam> oparams;
  for (const auto& p : model->named_parameters()) oparams.push_back({p.name, p.tensor, p.decay && p.tensor.dim() >= 2});
  // [dist] Gradient averaging (or under invariant numerics the row tree's sum); the optimizer updates
  // every parameter, or this rank's ZeRO-1 slice.
  const bool row_tree = cfg.train.resolved_numerics() == Numerics::invariant;
  dist::DataParallel dp(comm, oparams,
                        {.zero = cfg.train.zero,
                         .bucket_bytes = cfg.train.dp_bucket_kb * 1024,
                         .overlap = cfg.train.dp_overlap,
                         .gradient_comm = gpu_comm.get(),
                         .tree_rows = row_tree ? cfg.train.batch_size * cfg.train.grad_accum : 0});
  AdamW opt(dp.optimizer_params(), AdamWOptions::from(cfg.train));
  Batcher batcher(data.train, batcher_options(cfg, seed, comm, cfg.train.grad_accum));
  const CorpusFingerprint corpus = corpus_fingerprint(data);

  TrainState state = start_state(cfg, opts, data, corpus, *model, dp, opt, batcher);
  check_ranks_agree_on_start(comm, data, dp, state.step);  // [dist]
  if (!opts.resume.empty() && state.step >= cfg.train.max_steps) return nothing_to_do(state, opts.resume, t_start);
  if (dp.distributed() && opts.progress && root) std::fprintf(stderr, "qkv: %s\n", dp.describe().c_str());  // [dist]
  if (cfg.train.dtype == DType::bf16 && !on_gpu && opts.progress && root)
    std::fprintf(stderr, "qkv: bf16 GEMM %s\n", cpu::bf16_kernel_reason().c_str());

  const std::string out_dir = cfg.train.out_dir;
  std::optional<RunDirLock> lock;  // [dist] rank 0 alone writes to out_dir, so it alone locks it
  if (root) {
    std::error_code ec;
    std::filesystem::create_directories(out_dir, ec);
    QKV_CHECK(!ec && std::filesystem::is_directory(out_dir), out_dir, ": cannot create train.out_dir (",
              ec ? ec.message() : "a file of that name exists", ")");
    lock.emplace(out_dir);  // before anything in out_dir is truncated or replaced
    claim_run_dir(out_dir, opts, state.step);
  }
  RunLog log(out_dir + "/metrics.jsonl", root, !opts.resume.empty(), opts.progress && root,
             opts.progress && isatty(STDERR_FILENO), state.step, cfg.train.max_steps, t_start);
  const LrSchedule schedule = LrSchedule::from(cfg.train);
  const std::vector<Tensor> params = model->parameters();
  StepContext ctx{cfg, comm, *model, dp, opt, batcher, schedule, params, seed};
  // Validation batches: global batches of G rows under the row tree (so the value is the same for
  // every split of G), else world x batch_size rows.
  const BatcherOptions val_opts =
      batcher_options(cfg, seed ^ 0x9e3779b97f4a7c15ull, comm, row_tree ? cfg.train.grad_accum : 1);
  const auto validation_loss = [&]() -> double {
    model->eval();  // no dropout; train_step sets training mode again
    if (!row_tree) {
      LossSum v = evaluate_split(*model, data.val, val_opts, cfg.train.eval_batches);
      if (dp.distributed()) v = {comm.sum_ordered(v.sum), comm.sum_ordered(v.tokens)};  // [dist]
      return v.mean();
    }
    std::vector<LossSum> rows = evaluate_rows(*model, data.val, val_opts, cfg.train.eval_batches);
    std::vector<LossSum> all(rows.size() * static_cast<size_t>(comm.world()));
    comm.allgather(rows.data(), all.data(), static_cast<int64_t>(rows.size() * sizeof(LossSum)));  // [dist]
    // Rank-major as gathered; added batch by batch, rank by rank, row by row: global row order.
    const int64_t per_batch = cfg.train.batch_size * cfg.train.grad_accum;
    LossSum v;
    for (int64_t b = 0; b < cfg.train.eval_batches; ++b)
      for (size_t r = 0; r < static_cast<size_t>(comm.world()); ++r)
        for (int64_t i = 0; i < per_batch; ++i) {
          const LossSum& x = all[r * rows.size() + static_cast<size_t>(b * per_batch + i)];
          v.sum += x.sum;
          v.tokens += x.tokens;
        }
    return v.mean();
  };

  TrainSummary summary;
  const int64_t first_step = state.step;
  double last_loss = NAN, last_val = NAN;
  // [dist] Collective: with train.zero = 1 the moments are gathered to rank 0, which writes.
  auto save = [&](const std::string& path) {
    state.data = batcher.state();
    const std::shared_ptr<const AdamW> full = full_optimizer_state(dp, opt);
    if (root) save_checkpoint(path, cfg, *model, full.get(), state, *data.tokenizer);
    summary.checkpoint = path;
  };

  while (state.step < cfg.train.max_steps) {
    if (opts.before_step) opts.before_step(state.step);
    const auto t0 = Clock::now();
    const StepResult s = train_step(ctx, state);
    log.count_step(ms_since(t0), s.tokens);
    last_loss = s.loss;

    const bool last = state.step == cfg.train.max_steps;
    bool stop = false;  // on_log asked to stop after this step
    std::optional<double> val;
    if (every(cfg.train.eval_interval, state.step) || last) {
      val = last_val = validation_loss();
      if (last_val < state.best_val_loss) {
        state.best_val_loss = last_val;
        save(out_dir + "/best.h5");
      }
    }
    if (every(std::max<int64_t>(cfg.train.log_interval, 1), state.step) || val || last) {
      LogRecord r{.step = state.step,
                  .loss = s.loss,
                  .lr = s.lr,
                  .grad_norm = s.grad_norm,
                  .fully_masked_rows = dp.distributed() ? comm.sum_ordered(ctx.masked_rows) : ctx.masked_rows,
                  .skipped_steps = state.skipped_steps,
                  .val_loss = val,
                  .comm_seconds = std::nullopt};
      if (dp.distributed()) r.comm_seconds = dp.take_comm_seconds();  // [dist]
      const nlohmann::json line = log.record(r, val || last);
      if (opts.on_log) {
        stop = root && !opts.on_log(line) && !last;
        if (dp.distributed()) stop = comm.sum_ordered(static_cast<int64_t>(stop)) > 0;  // [dist]
      }
    }
    if (every(cfg.train.checkpoint_interval, state.step) || last || stop) {
      save(out_dir + "/" + checkpoint_name(state.step));
      if (root) prune_checkpoints(out_dir, cfg.train.keep_last);
    }
    if (stop) {
      summary.stopped = true;
      break;
    }
  }
  // [dist] Replicas must still agree (a transport that returned different sums would show here).
  dist::check_same_on_all_ranks(comm, dp.parameter_hash(), "the final parameters");

  summary.step = state.step;
  summary.loss = last_loss;
  summary.val_loss = last_val;
  summary.best_val_loss = state.best_val_loss;
  summary.skipped_steps = state.skipped_steps;
  summary.seconds = std::chrono::duration<double>(Clock::now() - t_start).count();
  const int64_t steps_run = state.step - first_step;
  summary.tokens_per_s =
      steps_run > 0 ? static_cast<double>(steps_run * cfg.train.grad_accum * comm.world() * cfg.train.batch_size *
                                          cfg.train.resolved_seq_len(cfg.model.block_size)) /
                          summary.seconds
                    : 0;  // [dist] global
  return summary;
}

}  // namespace qkv::train

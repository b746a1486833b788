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

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/functions.h"
#include "tensor/cuda/cuda_backend.h"
#include "train/checkpoint.h"
#include "train/clip.h"
#include "distributed/data_parallel.h"  // [dist]
#include "distributed/distributed.h"    // [dist]
#include "distributed/nccl.h"           // [dist]
#include "train/evaluate.h"
#include "train/model_factory.h"
#include "train/optimizer.h"
#include "train/plot.h"
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

std::string format_duration(double s) {
  char buf[32];
  const int64_t t = static_cast<int64_t>(s + 0.5);
  std::snprintf(buf, sizeof buf, "%lld:%02lld", static_cast<long long>(t / 60), static_cast<long long>(t % 60));
  return buf;
}

BatcherOptions batcher_options(const Config& cfg, uint64_t seed, const dist::Communicator& comm) {
  BatcherOptions o;
  o.rank = comm.rank();  // [dist] this rank's rows of the global batch
  o.world = comm.world();
  o.mode = parse_batch_mode(cfg.data.batching);
  o.batch_size = cfg.train.batch_size;
  o.block_size = cfg.train.resolved_seq_len(cfg.model.block_size);
  o.seed = seed;
  o.padding = parse_padding(cfg.data.padding_side);
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

// Settings that must not change across a resume (they change the computation).
void check_resumable(const Config& now, const Config& then, const std::string& ckpt) {
  QKV_CHECK(now.model == then.model, ckpt, ": [model] settings differ from the run being resumed");
  QKV_CHECK(now.data.tokenizer == then.data.tokenizer && now.data.batching == then.data.batching,
            ckpt, ": data.tokenizer or data.batching differ from the run being resumed");
  QKV_CHECK(now.train.seed == then.train.seed && now.train.batch_size == then.train.batch_size &&
                now.train.grad_accum == then.train.grad_accum,
            ckpt, ": train.seed, batch_size or grad_accum differ from the run being resumed");
  // Each by name: a resumed run must see the same rows (seq_len) and the same split (val_fraction).
  auto same = [&](const char* key, auto a, auto b) {
    QKV_CHECK(a == b, ckpt, ": ", key, " is ", b, " in the run being resumed but ", a,
              " now (it must not change across a resume)");
  };
  same("train.seq_len", now.train.resolved_seq_len(now.model.block_size),
       then.train.resolved_seq_len(then.model.block_size));
  same("data.val_fraction", now.data.val_fraction, then.data.val_fraction);
}

// The corpus must be the one the checkpoint was trained on (not just one with the same vocabulary).
void check_same_corpus(const CheckpointMeta& meta, const CorpusFingerprint& now, const std::string& data_path,
                       bool warn) {
  if (!meta.state.corpus) {
    if (warn)
      std::fprintf(stderr, "qkv: warning: %s records no corpus fingerprint (written by an older qkv): cannot check "
                   "that data.path is the corpus it was trained on\n", meta.path.c_str());
    return;
  }
  const CorpusFingerprint& then = *meta.state.corpus;
  QKV_CHECK(then == now, meta.path, ": data.path (", data_path.empty() ? "random tokens" : data_path,
            ") is not the corpus of the run being resumed: ", now.tokens, " tokens with fingerprint ",
            std::to_string(now.fnv1a64), " now, ", then.tokens, " tokens with fingerprint ",
            std::to_string(then.fnv1a64), " in the checkpoint");
}

}  // namespace

TrainSummary run_training(const Config& cfg_in, const TrainOptions& opts) {
  const Config cfg = cfg_in.resolved();
  QKV_CHECK(cfg.train.device == "cpu" || cfg.train.device == "cuda", "train.device must be cpu or cuda");
  const bool on_gpu = cfg.train.device == "cuda";
  // train.dtype = "bf16": matmuls and attention in bf16 (float32 accumulation) for every forward,
  // backward and evaluation of this run; weights, gradients and AdamW state stay float32.
  const autograd::AutocastGuard autocast(cfg.train.dtype == "bf16");
  QKV_CHECK(opts.resume.empty() || opts.init_from.empty(), "--resume and --init-from are exclusive");
  apply_thread_setting(cfg);
  // [dist] One rank per process (dist::world(): MPI under mpirun, else one process); only rank 0
  // prints, writes metrics and checkpoints. Every rank must run the same config.
  dist::Communicator& comm = dist::world();
  const bool root = comm.is_root();
  check_ranks_agree_on_config(comm, cfg, opts.resume, opts.init_from);
  const auto t_start = Clock::now();

  RunData data = load_run_data_rank0_first(comm, cfg);  // [dist] rank 0 writes the prepared-data cache
  auto model = build_model(cfg, data.vocab_size);
  const uint64_t seed = static_cast<uint64_t>(cfg.train.seed);
  model->init_weights(seed);  // on the CPU: the same initial weights whatever the device
  std::unique_ptr<dist::Communicator> gpu_comm;  // [dist] NCCL for the gradients, one rank per GPU
  if (on_gpu) {
    QKV_CHECK(cuda::device_count() > 0,
              "train.device = \"cuda\": no CUDA device is visible (or this build has no CUDA backend)");
    if (comm.world() > 1) gpu_comm = dist::make_nccl_gradients(comm);  // also selects this rank's GPU
    model->to(Device::cuda);  // before the optimizer, so its moments are allocated there
  }

  TrainState state;
  state.seed = seed;
  state.batch_mode = cfg.data.batching;
  std::vector<OptimParam> oparams;
  for (const auto& p : model->named_parameters()) oparams.push_back({p.name, p.tensor, p.decay && p.tensor.dim() >= 2});
  // [dist] The optimizer (replicated, or sharded with train.zero = 1) and gradient averaging.
  DataParallel dp(comm, oparams, AdamWOptions::from(cfg.train),
                  {.zero = cfg.train.zero, .gradient_comm = gpu_comm.get()});
  Batcher batcher(data.train, batcher_options(cfg, seed, comm));
  const CorpusFingerprint corpus = corpus_fingerprint(data);

  if (!opts.resume.empty()) {
    CheckpointMeta meta = read_checkpoint_meta(opts.resume);
    check_resumable(cfg, meta.config.resolved(), opts.resume);
    QKV_CHECK(meta.tokenizer->serialize() == data.tokenizer->serialize(), opts.resume,
              ": the checkpoint's tokenizer differs from the one built from data.path");
    check_same_corpus(meta, corpus, cfg.data.random_tokens ? "" : cfg.data.path, root);
    QKV_CHECK(meta.has_optimizer, opts.resume, ": has no optimizer state to resume from");
    load_model_weights(opts.resume, *model);
    dp.load_optimizer_state(opts.resume);
    state = meta.state;
    batcher.restore(state.data);
  } else if (!opts.init_from.empty()) {
    load_model_weights(opts.init_from, *model);
  }
  state.corpus = corpus;

  check_ranks_agree_on_start(comm, data, dp, state.step);  // [dist]
  if (!opts.resume.empty() && state.step >= cfg.train.max_steps) {
    // Nothing to train: report the checkpoint as it is (no loss was computed, so none is
    // reported) and leave the run directory untouched. Every rank returns here alike.
    TrainSummary done;
    done.step = state.step;
    done.loss = NAN;
    done.best_val_loss = state.best_val_loss;
    done.skipped_steps = state.skipped_steps;
    done.checkpoint = opts.resume;
    done.nothing_to_do = true;
    done.seconds = std::chrono::duration<double>(Clock::now() - t_start).count();
    return done;
  }
  if (dp.distributed() && opts.progress && root) std::fprintf(stderr, "qkv: %s\n", dp.describe().c_str());  // [dist]

  const std::string out_dir = cfg.train.out_dir;
  const std::string metrics_path = out_dir + "/metrics.jsonl";
  std::ofstream metrics;
  std::optional<RunDirLock> lock;  // [dist] rank 0 alone writes to out_dir, so it alone locks it
  if (root) {  // [dist]
    std::filesystem::create_directories(out_dir);
    lock.emplace(out_dir);  // before anything in out_dir is truncated or replaced
    metrics.open(metrics_path, opts.resume.empty() ? std::ios::trunc : std::ios::app);
    QKV_CHECK(metrics.good(), metrics_path, ": cannot write metrics");
  }
  const LrSchedule schedule = LrSchedule::from(cfg.train);
  const std::vector<Tensor> params = model->parameters();
  const int64_t accum = cfg.train.grad_accum;
  const bool tty = opts.progress && isatty(STDERR_FILENO);
  const bool progress = opts.progress && root;  // [dist]
  BatcherOptions val_opts = batcher_options(cfg, seed ^ 0x9e3779b97f4a7c15ull, comm);

  TrainSummary summary;
  const int64_t first_step = state.step;
  double last_loss = NAN, last_val = NAN;
  int64_t masked_rows = 0;
  double window_ms = 0;
  int64_t window_steps = 0, window_tokens = 0;

  // [dist] Collective: with train.zero = 1 the moments are gathered to rank 0, which writes.
  auto save = [&](const std::string& path) {
    state.data = batcher.state();
    const std::shared_ptr<const AdamW> opt = dp.optimizer_for_checkpoint();
    if (root) save_checkpoint(path, cfg, *model, opt.get(), state, *data.tokenizer);
    summary.checkpoint = path;
  };

  while (state.step < cfg.train.max_steps) {
    dist::maybe_die_for_test(state.step);  // [dist] test-only fault injection
    const auto t0 = Clock::now();
    model->train();
    dp.zero_grads();  // [dist] one process: autograd::zero_grad(params)
    double loss_sum = 0;
    int64_t step_tokens = 0;
    for (int64_t micro = 0; micro < accum; ++micro) {
      Batch b = batcher.next();
      // [dist] w = 1 on one process; per-rank dropout keys (rank 0 keeps the run's seed).
      const double w = micro_batch_weight(comm, b.n_targets);
      nn::RngContext rng{rank_dropout_seed(seed, comm.rank()), static_cast<uint64_t>(state.step * accum + micro), 0};
      Tensor loss = batch_loss(*model, b, rng, &masked_rows);
      loss_sum += w * loss.item();
      const double scale = w / static_cast<double>(accum);
      if (micro == accum - 1) dp.arm_overlap();  // [dist] gradients final in this backward: reduce as they come
      autograd::backward(scale == 1.0 ? loss : ag::mul(loss, scale));
      step_tokens += b.x.numel();
    }
    // [dist] Mean gradients and the global batch's loss and token count on every rank.
    dp.reduce_grads();
    if (dp.distributed()) {
      loss_sum = comm.sum_ordered(loss_sum) / static_cast<double>(comm.world());
      step_tokens = comm.sum_ordered(step_tokens);
    }
    const double loss = loss_sum / static_cast<double>(accum);
    const double grad_norm = global_grad_norm(params);
    const double lr = schedule.at(state.step);
    if (!std::isfinite(loss) || !std::isfinite(grad_norm)) {
      // Skip: no update, counted; too many in a row ends the run rather than training on NaN.
      state.skipped_steps++;
      state.bad_steps_in_a_row++;
      if (root)  // [dist]
        std::fprintf(stderr, "qkv: step %lld: non-finite %s, step skipped (%lld in a row)\n",
                     static_cast<long long>(state.step), std::isfinite(loss) ? "gradients" : "loss",
                     static_cast<long long>(state.bad_steps_in_a_row));
      QKV_CHECK(state.bad_steps_in_a_row < cfg.train.max_bad_steps, "training stopped: ", state.bad_steps_in_a_row,
                " non-finite steps in a row (train.max_bad_steps = ", cfg.train.max_bad_steps,
                "); lower train.lr or check the data");
    } else {
      state.bad_steps_in_a_row = 0;
      dp.step(lr, cfg.train.grad_clip > 0 ? clip_scale(grad_norm, cfg.train.grad_clip) : 1.0f);  // [dist]
    }
    if (!dp.distributed()) autograd::zero_grad(params);  // [dist] else the flat buffer stays bound
    state.step++;
    state.tokens_seen += step_tokens;
    last_loss = loss;
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    window_ms += ms;
    window_steps++;
    window_tokens += step_tokens;

    const bool last = state.step == cfg.train.max_steps;
    bool evaluated = false;
    if ((cfg.train.eval_interval > 0 && state.step % cfg.train.eval_interval == 0) || last) {
      LossSum val = evaluate_split(*model, data.val, val_opts, cfg.train.eval_batches);
      if (dp.distributed()) val = {comm.sum_ordered(val.sum), comm.sum_ordered(val.tokens)};  // [dist]
      last_val = val.mean();
      evaluated = true;
      if (last_val < state.best_val_loss) {
        state.best_val_loss = last_val;
        save(out_dir + "/best.h5");
      }
    }
    if (state.step % std::max<int64_t>(cfg.train.log_interval, 1) == 0 || evaluated || last) {
      const int64_t all_masked_rows = dp.distributed() ? comm.sum_ordered(masked_rows) : masked_rows;  // [dist]
      nlohmann::json j = {{"step", state.step},
                          {"loss", loss},
                          {"lr", lr},
                          {"grad_norm", grad_norm},
                          {"tokens_per_s", window_tokens / (window_ms / 1000.0)},
                          {"ms_per_step", window_ms / static_cast<double>(window_steps)},
                          {"fully_masked_rows", all_masked_rows},
                          {"skipped_steps", state.skipped_steps}};
      if (evaluated) j["val_loss"] = last_val;
      if (dp.distributed()) j["comm_ms_per_step"] = 1000.0 * dp.take_comm_seconds() / static_cast<double>(window_steps);  // [dist]
      if (root) {  // [dist]
        errno = 0;
        metrics << j.dump() << "\n";
        metrics.flush();
        // A full disk (or metrics.jsonl pointing at /dev/full) must stop the run, not lose the log.
        QKV_CHECK(metrics.good(), metrics_path, ": cannot write metrics (", errno ? std::strerror(errno) : "write failed", ")");
      }
      const double elapsed = std::chrono::duration<double>(Clock::now() - t_start).count();
      const double eta = elapsed / static_cast<double>(state.step - first_step) *
                         static_cast<double>(cfg.train.max_steps - state.step);
      if (progress) {
        char line[256];
        std::snprintf(line, sizeof line, "step %lld/%lld  loss %.4f%s  lr %.2e  %.0f tok/s  %.1f ms/step  ETA %s",
                      static_cast<long long>(state.step), static_cast<long long>(cfg.train.max_steps), loss,
                      evaluated ? (" val " + std::to_string(last_val).substr(0, 6)).c_str() : "", lr,
                      window_tokens / (window_ms / 1000.0), window_ms / static_cast<double>(window_steps),
                      format_duration(eta).c_str());
        std::fprintf(stderr, tty ? "\r%-110s%s" : "%s%s\n", line, tty && (evaluated || last) ? "\n" : "");
      }
      window_ms = 0;
      window_steps = window_tokens = 0;
    }
    if ((cfg.train.checkpoint_interval > 0 && state.step % cfg.train.checkpoint_interval == 0) || last) {
      save(out_dir + "/" + checkpoint_name(state.step));
      if (root) prune_checkpoints(out_dir, cfg.train.keep_last);  // [dist]
    }
  }
  // [dist] Replicas must still agree (a transport that returned different sums would show here).
  dist::check_same_on_all_ranks(comm, dp.parameter_hash(), "the final parameters");
  if (opts.plot && root) plot_metrics(metrics_path, out_dir + "/loss.svg");

  summary.step = state.step;
  summary.loss = last_loss;
  summary.val_loss = last_val;
  summary.best_val_loss = state.best_val_loss;
  summary.skipped_steps = state.skipped_steps;
  summary.seconds = std::chrono::duration<double>(Clock::now() - t_start).count();
  const int64_t steps_run = state.step - first_step;
  summary.tokens_per_s = steps_run > 0 ? static_cast<double>(steps_run * accum * comm.world() * cfg.train.batch_size * cfg.train.resolved_seq_len(cfg.model.block_size)) / summary.seconds : 0;  // [dist] global
  return summary;
}

}  // namespace qkv::train

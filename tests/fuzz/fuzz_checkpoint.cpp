// libFuzzer target for qkv's HDF5 readers: checkpoints (train/checkpoint.h) and prepared datasets
// (data/dataset.h). Structure-aware: libhdf5 is not ours to fuzz, so raw file bytes are never
// mutated. Instead, a real small checkpoint and a real prepared dataset are written once, and
// each input is read as a program of edits made through the HDF5 C API on a copy of one of them:
// delete an object, add a soft, external or second hard link, replace a dataset with one of
// another type and shape, set or delete an attribute (any type and value), add a group, replace
// the stored config TOML or tokenizer JSON with text from the input (with its checksum kept
// right or not). Every file so made is a valid HDF5 file; qkv's readers must load it or throw
// qkv::Error: read_checkpoint_meta, loading the weights into the model it describes (when that
// model is small), verify_checkpoint_data, list_model_tensors and load_dataset. Anything else
// (a crash, a sanitizer report, another exception) is a finding. Built and run by
// tests/fuzz/run_fuzz.sh.
#include <hdf5.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/h5.h"
#include "data/tokenizer.h"
#include "tensor/error.h"
#include "train/checkpoint.h"
#include "train/model_factory.h"

namespace {

namespace fs = std::filesystem;

// The input, read front to back; past its end every read gives 0.
struct Input {
  const uint8_t* p;
  size_t n;
  uint8_t byte() { return n ? (--n, *p++) : 0; }
  uint64_t u64() {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v = v << 8 | byte();
    return v;
  }
  std::string text(size_t max) {
    size_t len = std::min<size_t>(byte() | size_t(byte()) << 8, std::min(max, n));
    std::string s(reinterpret_cast<const char*>(p), len);
    p += len, n -= len;
    return s;
  }
};

std::vector<qkv::train::OptimParam> optim_params(const qkv::nn::DecoderModel& model) {
  std::vector<qkv::train::OptimParam> out;
  for (const auto& p : model.named_parameters()) out.push_back({p.name, p.tensor, p.decay});
  return out;
}

struct Paths {
  std::string dir, checkpoint, dataset, work, other;
};

const Paths& paths() {
  static const Paths p = [] {
    char name[] = "/tmp/qkv_fuzz_checkpoint_XXXXXX";
    if (!mkdtemp(name)) std::abort();
    Paths q{name, std::string(name) + "/base.h5", std::string(name) + "/data.h5", std::string(name) + "/work.h5",
            std::string(name) + "/other.h5"};
    qkv::h5::quiet();
    // The checkpoint: a small llama (GQA, untied head) with a bpe tokenizer and optimizer moments.
    qkv::Config cfg;
    cfg.model.family = qkv::nn::Family::llama;
    cfg.model.n_layer = 1;
    cfg.model.n_head = 2;
    cfg.model.n_kv_head = 1;
    cfg.model.n_embd = 8;
    cfg.model.block_size = 8;
    cfg.data.tokenizer = qkv::TokenizerKind::bpe;
    cfg.data.bpe_vocab_size = 260;
    auto tok = qkv::make_tokenizer(qkv::TokenizerKind::bpe, "abab abab cdcd cdcd abcd abcd", {260});
    cfg = cfg.resolved();
    auto model = qkv::train::build_model(cfg, tok->vocab_size());
    qkv::train::AdamW opt(optim_params(*model), {});
    qkv::train::TrainState state;
    state.step = 3;
    state.corpus = qkv::train::CorpusFingerprint{100, 42};
    qkv::train::save_checkpoint(q.checkpoint, cfg, *model, &opt, state, *tok);
    // The prepared dataset: char tokens of a few documents.
    qkv::PrepareOptions o;
    o.tokenizer = qkv::TokenizerKind::character;
    o.separator = qkv::DocSeparator::blank_line;
    o.val_fraction = 0.5;
    qkv::save_dataset(qkv::prepare_text("one doc\n\ntwo docs\n\nthree docs\n\nfour", "fuzz", o), q.dataset, o);
    return q;
  }();
  return p;
}

// Every object's path in `file` ("/" first), and every attribute name (any object).
struct Names {
  std::vector<std::string> objects, attributes;
};
herr_t visit(hid_t, const char* name, const H5O_info_t*, void* data) {
  auto* n = static_cast<Names*>(data);
  n->objects.push_back(std::string(name) == "." ? "/" : "/" + std::string(name));
  return 0;
}
herr_t attr_name(hid_t, const char* name, const H5A_info_t*, void* data) {
  static_cast<Names*>(data)->attributes.push_back(name);
  return 0;
}

const char* const kNewNames[] = {"x", "weight", "model", "json", "config", "tokens", "offsets", "exp_avg", ""};

// A datatype: integers and floats of each width, fixed and variable strings, an array, a compound.
hid_t make_type(Input& in) {
  switch (in.byte() % 12) {
    case 0:
      return H5Tcopy(H5T_STD_I8LE);
    case 1:
      return H5Tcopy(H5T_STD_U8LE);
    case 2:
      return H5Tcopy(H5T_STD_I32LE);
    case 3:
      return H5Tcopy(H5T_STD_I64LE);
    case 4:
      return H5Tcopy(H5T_STD_U64LE);
    case 5:
      return H5Tcopy(H5T_IEEE_F32LE);
    case 6:
      return H5Tcopy(H5T_IEEE_F64LE);
    case 7:
      return H5Tcopy(H5T_IEEE_F32BE);
    case 8: {
      hid_t t = H5Tcopy(H5T_C_S1);
      H5Tset_size(t, 1 + in.byte() % 16);
      return t;
    }
    case 9: {
      hid_t t = H5Tcopy(H5T_C_S1);
      H5Tset_size(t, H5T_VARIABLE);
      H5Tset_cset(t, H5T_CSET_UTF8);
      return t;
    }
    case 10: {
      const hsize_t dims[1] = {1 + in.byte() % 3u};
      return H5Tarray_create2(H5T_STD_I64LE, 1, dims);
    }
    default: {
      hid_t t = H5Tcreate(H5T_COMPOUND, 12);
      H5Tinsert(t, "a", 0, H5T_STD_I32LE);
      H5Tinsert(t, "b", 4, H5T_IEEE_F64LE);
      return t;
    }
  }
}

// A dataspace: scalar, null, or up to 3 dimensions of up to 8.
hid_t make_space(Input& in, hsize_t& count) {
  const uint8_t kind = in.byte() % 6;
  count = 1;
  if (kind == 0) return H5Screate(H5S_SCALAR);
  if (kind == 1) {
    count = 0;
    return H5Screate(H5S_NULL);
  }
  hsize_t dims[3];
  const int rank = kind - 2 > 2 ? 1 : kind - 1;
  for (int i = 0; i < rank; ++i) count *= (dims[i] = in.byte() % 9);
  return H5Screate_simple(rank, dims, nullptr);
}

// Fills `n` elements of `type` from the input; variable strings point into `strings`.
std::vector<uint8_t> make_values(Input& in, hid_t type, hsize_t n, std::vector<std::string>& strings,
                                 std::vector<const char*>& pointers) {
  if (H5Tis_variable_str(type) > 0) {
    strings.clear();
    pointers.clear();
    for (hsize_t i = 0; i < n; ++i) strings.push_back(in.text(256));
    for (const std::string& s : strings) pointers.push_back(s.c_str());
    std::vector<uint8_t> raw(n * sizeof(char*));
    if (n) std::memcpy(raw.data(), pointers.data(), raw.size());
    return raw;
  }
  std::vector<uint8_t> raw(n * H5Tget_size(type));
  for (uint8_t& b : raw) b = in.byte();
  return raw;
}

void set_attribute(hid_t obj, const std::string& name, Input& in) {
  if (H5Aexists(obj, name.c_str()) > 0) H5Adelete(obj, name.c_str());
  hid_t type = make_type(in);
  hsize_t n = 0;
  hid_t space = make_space(in, n);
  std::vector<std::string> strings;
  std::vector<const char*> pointers;
  const std::vector<uint8_t> raw = make_values(in, type, n, strings, pointers);
  hid_t a = H5Acreate2(obj, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT);
  if (a >= 0) {
    if (n) H5Awrite(a, type, raw.data());
    H5Aclose(a);
  }
  H5Sclose(space);
  H5Tclose(type);
}

// A string attribute `name` = text (replacing any), as qkv writes them (variable-length UTF-8).
void set_text_attribute(hid_t obj, const char* name, const std::string& text) {
  if (H5Aexists(obj, name) > 0) H5Adelete(obj, name);
  hid_t type = H5Tcopy(H5T_C_S1);
  H5Tset_size(type, H5T_VARIABLE);
  H5Tset_cset(type, H5T_CSET_UTF8);
  hid_t space = H5Screate(H5S_SCALAR);
  hid_t a = H5Acreate2(obj, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
  const char* p = text.c_str();
  H5Awrite(a, type, &p);
  H5Aclose(a);
  H5Sclose(space);
  H5Tclose(type);
}

void set_int_attribute(hid_t obj, const char* name, int64_t v) {
  if (H5Aexists(obj, name) > 0) H5Adelete(obj, name);
  hid_t space = H5Screate(H5S_SCALAR);
  hid_t a = H5Acreate2(obj, name, H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT);
  H5Awrite(a, H5T_NATIVE_INT64, &v);
  H5Aclose(a);
  H5Sclose(space);
}

void make_dataset(hid_t file, const std::string& path, Input& in) {
  hid_t type = make_type(in);
  hsize_t n = 0;
  hid_t space = make_space(in, n);
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  const uint8_t layout = in.byte();
  if (H5Sget_simple_extent_type(space) == H5S_SIMPLE && n > 0 && layout % 3 != 0) {
    hsize_t dims[3];
    const int rank = H5Sget_simple_extent_dims(space, dims, nullptr);
    H5Pset_chunk(dcpl, rank, dims);
    if (layout % 3 == 1) H5Pset_fletcher32(dcpl);
  }
  std::vector<std::string> strings;
  std::vector<const char*> pointers;
  const std::vector<uint8_t> raw = make_values(in, type, n, strings, pointers);
  hid_t d = H5Dcreate2(file, path.c_str(), type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  if (d >= 0) {
    if (n) H5Dwrite(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, raw.data());
    H5Dclose(d);
  }
  H5Pclose(dcpl);
  H5Sclose(space);
  H5Tclose(type);
}

// Replaces string dataset `path` with `text` (and its checksum attribute with the right one or not).
void replace_text_dataset(hid_t file, const std::string& path, const std::string& text, bool right_checksum) {
  if (H5Lexists(file, path.c_str(), H5P_DEFAULT) > 0) H5Ldelete(file, path.c_str(), H5P_DEFAULT);
  hid_t type = H5Tcopy(H5T_C_S1);
  H5Tset_size(type, H5T_VARIABLE);
  H5Tset_cset(type, H5T_CSET_UTF8);
  hid_t space = H5Screate(H5S_SCALAR);
  hid_t d = H5Dcreate2(file, path.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  if (d >= 0) {
    const char* p = text.c_str();
    H5Dwrite(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, &p);
    set_int_attribute(d, "fnv1a64",
                      right_checksum ? static_cast<int64_t>(qkv::h5::fnv1a64(text.data(), text.size())) : 12345);
    H5Dclose(d);
  }
  H5Sclose(space);
  H5Tclose(type);
}

// Applies the input's edits to `path`.
void edit(const std::string& path, Input& in) {
  hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  if (file < 0) std::abort();
  for (int step = 0; step < 8 && in.n > 0; ++step) {
    Names names;
    H5Ovisit2(file, H5_INDEX_NAME, H5_ITER_NATIVE, visit, &names, H5O_INFO_BASIC);
    const std::string obj = names.objects[in.byte() % names.objects.size()];
    const std::string target = names.objects[in.byte() % names.objects.size()];
    const std::string leaf = kNewNames[in.byte() % std::size(kNewNames)];
    const std::string beside = (obj == "/" ? std::string() : obj) + "/" + (leaf.empty() ? "y" : leaf);
    H5O_info_t info;
    H5Oget_info_by_name2(file, obj.c_str(), &info, H5O_INFO_BASIC, H5P_DEFAULT);
    const bool group = info.type == H5O_TYPE_GROUP;
    switch (in.byte() % 10) {
      case 0:  // delete the object (its link)
        if (obj != "/") H5Ldelete(file, obj.c_str(), H5P_DEFAULT);
        break;
      case 1:  // a soft link, maybe dangling
        if (group)
          H5Lcreate_soft(in.byte() % 2 ? target.c_str() : "/nowhere", file, beside.c_str(), H5P_DEFAULT, H5P_DEFAULT);
        break;
      case 2:  // a second hard link to an object
        if (group) H5Lcreate_hard(file, target.c_str(), file, beside.c_str(), H5P_DEFAULT, H5P_DEFAULT);
        break;
      case 3:  // an external link into another qkv file
        if (group)
          H5Lcreate_external(paths().dataset.c_str(), "/train", file, beside.c_str(), H5P_DEFAULT, H5P_DEFAULT);
        break;
      case 4:  // replace a dataset (or add one beside a group's children)
        if (!group) {
          H5Ldelete(file, obj.c_str(), H5P_DEFAULT);
          make_dataset(file, obj, in);
        } else {
          make_dataset(file, beside, in);
        }
        break;
      case 5: {  // set an attribute, of a name the file uses or a new one
        hid_t o = H5Oopen(file, obj.c_str(), H5P_DEFAULT);
        H5Aiterate2(o, H5_INDEX_NAME, H5_ITER_NATIVE, nullptr, attr_name, &names);
        H5Aiterate2(file, H5_INDEX_NAME, H5_ITER_NATIVE, nullptr, attr_name, &names);
        const uint8_t pick = in.byte();
        set_attribute(o, pick < names.attributes.size() ? names.attributes[pick] : leaf, in);
        H5Oclose(o);
        break;
      }
      case 6: {  // delete an attribute
        hid_t o = H5Oopen(file, obj.c_str(), H5P_DEFAULT);
        H5Aiterate2(o, H5_INDEX_NAME, H5_ITER_NATIVE, nullptr, attr_name, &names);
        if (!names.attributes.empty()) H5Adelete(o, names.attributes[in.byte() % names.attributes.size()].c_str());
        H5Oclose(o);
        break;
      }
      case 7:  // a new group
        if (group) H5Gclose(H5Gcreate2(file, beside.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
        break;
      case 8: {  // the config TOML from the input, its checksum right or not
        const std::string toml = in.text(4096);
        const bool right = in.byte() % 4 != 0;
        set_text_attribute(file, "config", toml);
        set_int_attribute(file, "config_fnv1a64",
                          right ? static_cast<int64_t>(qkv::h5::fnv1a64(toml.data(), toml.size())) : 1);
        break;
      }
      default: {  // the tokenizer JSON from the input, its checksum right or not
        const std::string json = in.text(4096);
        replace_text_dataset(file, "/tokenizer/json", json, in.byte() % 4 != 0);
        break;
      }
    }
  }
  H5Fclose(file);
}

// Whether the model `cfg` describes is small enough to build for every input.
bool small(const qkv::Config& cfg, int64_t vocab) {
  const qkv::ModelSettings& m = cfg.model;
  return m.n_layer <= 4 && m.n_embd <= 64 && m.block_size <= 256 && vocab <= 4096 && m.resolved_ffn_hidden() <= 512;
}

template <class F>
void expect_error_or_success(const F& f) {
  try {
    f();
  } catch (const qkv::Error&) {}
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Paths& p = paths();
  Input in{data, size};
  const bool checkpoint = in.byte() % 4 != 0;
  fs::copy_file(checkpoint ? p.checkpoint : p.dataset, p.work, fs::copy_options::overwrite_existing);
  edit(p.work, in);

  expect_error_or_success([&] {
    const qkv::train::CheckpointMeta meta = qkv::train::read_checkpoint_meta(p.work);
    const int64_t vocab = meta.tokenizer->vocab_size();
    if (!small(meta.config, vocab)) return;
    auto model = qkv::train::build_model(meta.config, vocab);
    qkv::train::load_model_weights(p.work, *model);
    if (meta.has_optimizer) {
      qkv::train::AdamW opt(optim_params(*model), {});
      qkv::train::load_optimizer_state(p.work, opt);
    }
  });
  expect_error_or_success([&] { qkv::train::verify_checkpoint_data(p.work); });
  expect_error_or_success([&] { qkv::train::list_model_tensors(p.work); });
  expect_error_or_success([&] { qkv::load_dataset(p.work); });
  return 0;
}

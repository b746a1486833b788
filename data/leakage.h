// Train/val leakage measures for `qkv leakcheck`: how much of the validation split the model
// could have seen verbatim during training.
//   ngram share      of all n-token windows inside val documents, the fraction whose exact token
//                    sequence also occurs inside some train document (n = 32 by default: long
//                    enough that natural text rarely repeats by chance, so a high share means
//                    copied passages).
//   duplicated docs  val documents whose token sequence equals a train document's exactly.
// Windows never span a document boundary. N-grams are compared by a 61-bit polynomial rolling
// hash (collisions ~ windows² / 2^61, negligible); duplicate documents are confirmed exactly.
#pragma once
#include <cstdint>

#include "data/dataset.h"

namespace qkv {

struct LeakageReport {
  int n = 32;
  int64_t val_ngrams = 0;     // n-token windows in val documents
  int64_t shared_ngrams = 0;  // ... that also occur in train
  double ngram_share = 0.0;   // shared / val_ngrams (0 when val has no window)
  int64_t val_docs = 0;
  int64_t duplicated_docs = 0;  // val documents equal to some train document
};

LeakageReport measure_leakage(const TokenSplit& train, const TokenSplit& val, int n = 32);

}  // namespace qkv

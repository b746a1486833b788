#!/usr/bin/env bash
# Sensitivity check of the emulation test (manual; 15 mutants, ~2 minutes): each mutant is a copy of
# attention/cuda/mma_attention_kernels.cuh with one injected bug (a sed script), compiled into the
# emulation test in place of the real header and run in `quick` mode. Every mutant must fail (a
# wrong result, a race, a read of unwritten shared memory, or an emulator abort); the unmutated
# header must pass. Usage: tests/emulation/run_mutants.sh [WORK_DIR]  (CXX picks the compiler).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
work=${1:-$(mktemp -d)}
mkdir -p "$work"
cxx=${CXX:-g++}
header=attention/cuda/mma_attention_kernels.cuh
missed=0

# mutant NAME SED_SCRIPT: builds and runs the test on the header edited by SED_SCRIPT ("" = none).
mutant() {
  local name=$1 script=$2 dir="$work/$1"
  mkdir -p "$dir/attention/cuda"
  sed -e "$script" "$root/$header" > "$dir/$header"
  if [[ -n $script ]] && cmp -s "$root/$header" "$dir/$header"; then
    echo "$name: the sed script changed nothing (the source moved on?)"
    missed=$((missed + 1))
    return
  fi
  if ! "$cxx" -std=gnu++20 -O2 -fno-strict-aliasing -Wno-unknown-pragmas -fsanitize=undefined \
      -fno-sanitize-recover=undefined -I"$dir" -I"$root" -o "$dir/test" \
      "$root/tests/emulation/test_mma_attention_emulation.cpp" > "$dir/build.log" 2>&1; then
    echo "$name: does not compile ($dir/build.log)"
    missed=$((missed + 1))
    return
  fi
  "$dir/test" quick > "$dir/run.log" 2>&1
  local rc=$? summary
  summary=$(grep -E -m1 "^emulator:|runtime error|cases, " "$dir/run.log")
  if [[ -z $script ]]; then
    if [[ $rc == 0 ]]; then
      echo "unmutated: passes"
    else
      echo "unmutated: FAILS ($dir/run.log)"
      missed=$((missed + 1))
    fi
  elif [[ $rc == 0 ]]; then
    echo "$name: MISSED"
    missed=$((missed + 1))
  else
    echo "$name: caught (exit $rc: $summary)"
  fi
}

mutant unmutated ''
# fragment layouts
mutant load_a_swap 's/ldmatrix_x4(f, a + ((lane \& 7) + ((lane >> 3) \& 1) \* 8) \* lda + (lane >> 4) \* 8);/ldmatrix_x4(f, a + ((lane \& 7) + (lane >> 4) * 8) * lda + ((lane >> 3) \& 1) * 8);/'
mutant load_bt_row 's/ldmatrix_x2(b0, b1, bt + (lane \& 7) \* ldb + ((lane >> 3) \& 1) \* 8);/ldmatrix_x2(b0, b1, bt + (lane \& 7) * ldb + ((lane >> 3) \& 1) * 8 * ldb);/'
mutant load_a_rows_col 's/f\[kk\]\[2\] = pair(row_g, kk \* 16 + c + 8);/f[kk][2] = pair(row_g, kk * 16 + c + 9);/'
mutant pbt_tile 's/pack_bf16(p\[2 \* kk\]\[2\], p\[2 \* kk\]\[3\])/pack_bf16(p[2 * kk + 1][0], p[2 * kk + 1][1])/'
mutant store_col 's/make_float2(c\[n\]\[2 \* r\] \* mul, c\[n\]\[2 \* r + 1\] \* mul)/make_float2(c[n][2 * r + 1] * mul, c[n][2 * r] * mul)/'
mutant stage_cols 's/dst\[(c + 1) \* ld + r\] = __float2bfloat16_rn(x.y);/dst[(c + 1) * ld + r] = __float2bfloat16_rn(x.z);/'
# barriers
mutant forward_no_first_sync '/__syncthreads();  \/\/ the previous tile is consumed$/d'
mutant dq_no_first_sync '/const int nk = imin(BK, j_end - j0);/{n;d}'
mutant dkv_no_second_sync '/dis\[e\] = e < nq/{n;n;d}'
# per-lane bookkeeping and masks
mutant dq_mask_row 's/const int r = c >> 1, j = j0 + n \* 8 + 2 \* (lane & 3) + (c & 1);/const int r = c \& 1, j = j0 + n * 8 + 2 * (lane \& 3) + (c >> 1);/'
mutant dkv_lse_column 's/- lse2s\[col\])/- lse2s[col ^ 1])/'
mutant quad_shuffle 's/return x + __shfl_xor_sync(kFull, x, 2);/return x + __shfl_xor_sync(kFull, x, 4);/'
mutant window_edge 's/(window <= 0 || j > p - window)/(window <= 0 || j >= p - window)/'
mutant rows_for_keys_end 's/imax(0, j1 - 1 + window - q_offset)/imax(0, j1 - 2 + window - q_offset)/'
mutant keys_for_rows_key_end 's/\*j1 = causal_like ? imin(key_end, q_offset + i1) : key_end;/*j1 = causal_like ? imin(key_end, q_offset + i1) : key_end - 1;/'

echo "work dir: $work"
if ((missed > 0)); then
  echo "$missed mutant(s) not caught"
  exit 1
fi
echo "every mutant caught"

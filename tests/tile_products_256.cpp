// attention/cpu/tile_products.cpp built once more, for 256-bit vectors (its target adds -mno-avx512f),
// so that on an AVX-512 host, where the library's copy uses 512-bit vectors, the tile-product
// tests also run at the width every other host gets (tests/CMakeLists.txt: tile_products_256bit).
#include "attention/cpu/tile_products.cpp"

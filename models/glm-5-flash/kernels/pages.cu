// pages.cu: rows between kvslab pages and a sequence's contiguous per-position buffers.
//
//   glm5flash_page_rows  for rows r < rows and columns c < dim, with paged_off [rows] the
//     element offset of row r in the pages (from paged) and dense_row [rows] its row in the
//     dense buffer (dim elements a row, from dense): to_dense != 0 copies the paged row
//     into the dense one (a sequence resumed from the prefix cache), else the dense row
//     into the pages (a step's new rows, written through); a thread an element.
#include "prelude.cuh"

RESIN_KERNEL void glm5flash_page_rows(float* __restrict__ paged, const long long* __restrict__ paged_off,
                                      float* __restrict__ dense, const long long* __restrict__ dense_row,
                                      int rows, int dim, int to_dense) {
  long long i = resin_global_tid();
  if (i >= (long long)rows * dim) return;
  int r = (int)(i / dim), c = (int)(i % dim);
  float* p = paged + paged_off[r] + c;
  float* d = dense + dense_row[r] * dim + c;
  if (to_dense) {
    *d = *p;
  } else {
    *p = *d;
  }
}

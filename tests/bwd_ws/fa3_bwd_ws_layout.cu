// TEST ONLY: host program (no GPU) that prints the shared-memory store addresses of the warp-
// specialized backward (kernels/fa3_bwd_ws.cuh) for tests/test_fa3_bwd_ws_build.py, which checks them
// against the documented layouts (a bijection onto the tile, the SW128 layout of dSᵀ, step d's chunk
// permutation and its inverse) and counts shared-memory bank conflicts per store instruction.
//
// Output, one line per stored 8-byte dQ pair / 4-byte dSᵀ pair, for both configurations (D=64, 128):
//   dq D cw warp lane nt h row col offset        (offset: dq_store_offset(dq_thread_base(...), nt, h))
//   ds D cw warp lane kk r offset                (offset: ds_store_offset(ds_thread_base(...), kk, r))
//   unswz D r k chunk                            (dq_swz_chunk(r, k), the convert kernel's inverse)
#include <cstdio>

#include "fa3_bwd_ws.cuh"

using namespace faprof_fa3_bwd;

template <class C>
void dump() {
  constexpr int D = C::D;
  for (int cw = 0; cw < 2; ++cw)
    for (int warp = 0; warp < 4; ++warp)
      for (int lane = 0; lane < 32; ++lane) {
        const uint32_t qb = dq_thread_base<D>(cw, warp, lane);
        for (int nt = 0; nt < 8; ++nt)
          for (int h = 0; h < 2; ++h) {
            const TilePos p = dq_frag_pos<C::DQ_NB>(cw, warp, lane, 4 * nt + 2 * h);
            std::printf("dq %d %d %d %d %d %d %d %d %u\n", D, cw, warp, lane, nt, h, p.row, p.col,
                        dq_store_offset<D>(qb, nt, h));
          }
        const uint32_t sb = ds_thread_base<C::BN>(cw, warp, lane);
        for (int kk = 0; kk < C::KQ; ++kk)
          for (int r = 0; r < 4; ++r)
            std::printf("ds %d %d %d %d %d %d %u\n", D, cw, warp, lane, kk, r, ds_store_offset<C::BN>(sb, kk, r));
      }
  for (int r = 0; r < 8; ++r)
    for (int k = 0; k < D / 4; ++k) std::printf("unswz %d %d %d %d\n", D, r, k, dq_swz_chunk(r, k));
}

int main() {
  dump<WsCfgD<64>>();
  dump<WsCfgD<128>>();
  return 0;
}

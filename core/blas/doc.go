// Package blas runs single-precision GEMM on a CBLAS library loaded at run time with
// purego (no cgo: CGO_ENABLED=0 builds keep working), so the CPU reference path can use
// OpenBLAS, BLIS or MKL where a machine has one. Without one, core/kernels/ref runs its
// own packed GEMM (AVX-512 or AVX2+FMA micro-kernels; about as fast as OpenBLAS on the
// models' prefill shapes), or gonum on a CPU without AVX2+FMA; Info says which and why.
//
// RESIN_BLAS picks:
//
//   - unset (or auto, on): a library when the search below finds one, else the own GEMM;
//   - own: the own GEMM, no search (gonum, with a warning, on a CPU without AVX2+FMA);
//   - blas: the search below, with a warning when it finds nothing (then the own GEMM);
//   - gonum, or off (its older name): gonum, no search.
//
// The library is chosen once per process, on first use, by this search order:
//
//  1. RESIN_BLAS=own, gonum or off: no library.
//  2. RESIN_BLAS_LIB: the file (or name) given. If it does not load or has no
//     cblas_sgemm, a warning naming it goes to stderr and the search goes on below.
//  3. OpenBLAS: libopenblas.so.0 / libopenblas.so through the dynamic loader, Debian's
//     openblas-pthread (then -openmp, -serial) directories, /usr/local/lib, /opt/OpenBLAS,
//     and the library of PyPI's scipy-openblas32 wheel (libscipy_openblas.so, whose symbols
//     carry a scipy_ prefix) in the usual site-packages directories and $VIRTUAL_ENV.
//  4. BLIS: libblis.so.4 / libblis.so, Debian's blis-pthread and blis-openmp directories.
//  5. MKL: libmkl_rt.so.2 / libmkl_rt.so, /opt/intel/oneapi/mkl/latest/lib.
//
// The first candidate that loads and exports cblas_sgemm wins; GEMMs are called through
// its sgemm_ and sgemv_, whose arguments are all pointers, so a call needs no reflection
// and allocates nothing. Its thread count is set to 1, or to RESIN_BLAS_THREADS when that
// is a positive integer, through openblas_set_num_threads, bli_thread_set_num_threads or
// MKL_Set_Num_Threads. On one thread the library is called from the CPU kernels' own
// worker pool (core/kernels/ref), which splits a large GEMM in blocks across GOMAXPROCS:
// one set of threads runs all parallel work, where the library's threads would spin beside
// the pool's (and a static split waits on its slowest thread when other processes load
// the cores). RESIN_BLAS_THREADS > 1 hands each GEMM whole to the library's threads. An OpenBLAS that runs pre-AVX2
// kernels on an AVX2 CPU (Debian bookworm's 0.3.21 calls recent Xeons Prescott) gets a
// warning naming the OPENBLAS_CORETYPE that fixes it.
package blas

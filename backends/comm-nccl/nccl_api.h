/*
 * The part of NCCL's stable C API that the plugin uses, declared here so that the plugin builds
 * without NCCL's headers (the CUDA toolkit does not always ship nccl.h) and opens libnccl.so.2
 * at run time (nccl_lib.cpp). Values and layouts are those of nccl.h since NCCL 2.14; the
 * config struct is the 2.14 one, which later versions accept (NCCL reads `size` and `version`
 * and fills fields it does not find with their defaults).
 */
#ifndef BACKPLANE_NCCL_API_H_
#define BACKPLANE_NCCL_API_H_

#include <limits.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ncclComm* ncclComm_t;
typedef struct CUstream_st* bp_nccl_stream_t; /* cudaStream_t */

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclNumResults = 8
} ncclResult_t;

typedef enum {
  ncclInt8 = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclFloat32 = 7,
  ncclFloat64 = 8,
  ncclBfloat16 = 9
} ncclDataType_t;

typedef enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 } ncclRedOp_t;

#define BP_NCCL_VERSION(X, Y, Z) \
  (((X) <= 2 && (Y) <= 8) ? (X)*1000 + (Y)*100 + (Z) : (X)*10000 + (Y)*100 + (Z))
#define NCCL_CONFIG_UNDEF_INT INT_MIN

/* ncclConfig_t of NCCL 2.14 (the first with non-blocking communicators). */
typedef struct {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
  int cgaClusterSize;
  int minCTAs;
  int maxCTAs;
  const char* netName;
} bp_nccl_config;

#define BP_NCCL_CONFIG_INITIALIZER                                                        \
  {                                                                                       \
    sizeof(bp_nccl_config), 0xcafebeef, BP_NCCL_VERSION(2, 14, 0), NCCL_CONFIG_UNDEF_INT, \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NULL         \
  }

/* ncclCommShrink's shrinkFlags (NCCL >= 2.27.3). */
#define BP_NCCL_SHRINK_DEFAULT 0x00
#define BP_NCCL_SHRINK_ABORT 0x01

#ifdef __cplusplus
}
#endif

#endif /* BACKPLANE_NCCL_API_H_ */

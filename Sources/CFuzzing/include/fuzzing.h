#ifndef BACKSTOP_FUZZING_H
#define BACKSTOP_FUZZING_H

#include <stddef.h>
#include <stdint.h>

/// libFuzzer's driver (compiler-rt, linked by -sanitize=fuzzer). SwiftPM renames an executable's entry point and
/// points `main` at it, so libFuzzer's own `main` is never linked in; the fuzz binary's entry calls this instead.
int LLVMFuzzerRunDriver(int *argc, char ***argv, int (*callback)(const uint8_t *data, size_t size));

#endif

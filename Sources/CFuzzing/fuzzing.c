// Declarations only (include/fuzzing.h): the definitions come from compiler-rt's libFuzzer.
#include "fuzzing.h"

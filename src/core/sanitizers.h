// BP_ASAN is 1 where AddressSanitizer instruments the file being compiled: gcc defines
// __SANITIZE_ADDRESS__, clang (the sanitizer build of scripts/test.sh) answers
// __has_feature(address_sanitizer) instead.
#pragma once

#if defined(__SANITIZE_ADDRESS__)
#define BP_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define BP_ASAN 1
#endif
#endif
#ifndef BP_ASAN
#define BP_ASAN 0
#endif

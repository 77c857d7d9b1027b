// Internal helpers shared by the native sources: errors that cross the C API as
// status codes + a thread-local message, and logging.
#pragma once

#include "moa.h"

#include <cstdarg>
#include <stdexcept>
#include <string>

// Thrown inside the library; converted to (status, moa_last_error()) at the C boundary.
struct moa_error : std::runtime_error {
    int32_t code;
    moa_error(int32_t c, const std::string & msg) : std::runtime_error(msg), code(c) {}
};

[[noreturn]] void moa_throw(int32_t code, const char * fmt, ...);
void moa_set_last_error(const std::string & msg, int32_t code = MOA_OK);

void moa_log_internal(int level, const char * fmt, ...);
#define MOA_LOG_DEBUG(...) moa_log_internal(1, __VA_ARGS__)
#define MOA_LOG_INFO(...)  moa_log_internal(2, __VA_ARGS__)
#define MOA_LOG_WARN(...)  moa_log_internal(3, __VA_ARGS__)
#define MOA_LOG_ERROR(...) moa_log_internal(4, __VA_ARGS__)

// Run f; map exceptions to a status code and record the message. For int32_t-returning
// entry points.
template <class F> int32_t moa_guard_status(F && f) {
    try {
        moa_set_last_error("");
        return f();
    } catch (const moa_error & e) {
        moa_set_last_error(e.what(), e.code);
        return e.code;
    } catch (const std::bad_alloc &) {
        moa_set_last_error("out of memory", MOA_ERR_OUT_OF_MEMORY);
        return MOA_ERR_OUT_OF_MEMORY;
    } catch (const std::exception & e) {
        moa_set_last_error(std::string("internal error: ") + e.what(), MOA_ERR_INTERNAL);
        return MOA_ERR_INTERNAL;
    }
}

// Same for pointer-returning constructors (NULL on failure).
template <class T, class F> T * moa_guard_ptr(F && f) {
    try {
        moa_set_last_error("");
        return f();
    } catch (const moa_error & e) {
        moa_set_last_error(e.what(), e.code);
    } catch (const std::bad_alloc &) {
        moa_set_last_error("out of memory", MOA_ERR_OUT_OF_MEMORY);
    } catch (const std::exception & e) {
        moa_set_last_error(std::string("internal error: ") + e.what(), MOA_ERR_INTERNAL);
    }
    return nullptr;
}

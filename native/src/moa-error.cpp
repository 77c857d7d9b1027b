// Last-error buffer and logging shared by every entry point.
#include "moa-impl.h"

#include <cstdio>
#include <vector>

static thread_local std::string g_last_error;
static thread_local int32_t     g_last_status = MOA_OK;

static void (*g_log_cb)(int32_t, const char *, void *) = nullptr;
static void * g_log_ud = nullptr;

void moa_set_last_error(const std::string & msg, int32_t code) {
    g_last_error  = msg;
    g_last_status = code;
}

static std::string vformat(const char * fmt, va_list ap) {
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(nullptr, 0, fmt, ap2);
    va_end(ap2);
    std::vector<char> buf(n > 0 ? n + 1 : 1);
    vsnprintf(buf.data(), buf.size(), fmt, ap);
    return std::string(buf.data());
}

void moa_throw(int32_t code, const char * fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::string msg = vformat(fmt, ap);
    va_end(ap);
    throw moa_error(code, msg);
}

void moa_log_internal(int level, const char * fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::string msg = vformat(fmt, ap);
    va_end(ap);
    msg += "\n";
    if (g_log_cb) {
        g_log_cb(level, msg.c_str(), g_log_ud);
    } else if (level >= 3) {
        fputs(msg.c_str(), stderr);
    }
}

extern "C" {

const char * moa_last_error(void) { return g_last_error.c_str(); }
int32_t      moa_last_status(void) { return g_last_status; }

void moa_log_set(void (*cb)(int32_t, const char *, void *), void * user_data) {
    g_log_cb = cb;
    g_log_ud = user_data;
}

int32_t moa_abi_version(void) { return MOA_ABI_VERSION; }

}  // extern "C"

/* Compiles moa.h as C (the header must stay valid C: cffi and C users read it). */
#include "moa.h"

int main(void) {
    struct moa_model_params mp;
    struct moa_state_params sp;
    moa_model_params_init(&mp);
    moa_state_params_init(&sp);
    return moa_abi_version() == MOA_ABI_VERSION ? 0 : 1;
}

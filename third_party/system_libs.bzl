"""Repository rule: one cc_library per Debian system library, flags from pkg-config.

Headers live in /usr/include (already on the compiler's search path); only the
link flags and extra include directories differ per library, and those come
from pkg-config so that abseil's long dependency list is never written by hand.
"""

# name -> (pkg-config modules, extra linkopts for libraries without a .pc file)
_LIBS = {
    "grpc": (["grpc++", "protobuf"], []),
    "protobuf": (["protobuf"], []),
    "eigen": (["eigen3"], []),
    "prometheus": (["prometheus-cpp-pull", "prometheus-cpp-core"], []),
    "yaml_cpp": (["yaml-cpp"], []),
    "zlib": (["zlib"], []),
    # Job keys, task tokens and the per-job CA (core/job_credentials).
    "openssl": (["openssl"], []),
    "gtest": (["gtest"], []),
    "gtest_main": (["gtest_main", "gtest"], []),
    # Swiss tables (ps/dynamic_table): only the targets that use them link them.
    "absl_hash_map": (["absl_flat_hash_map"], []),
    "absl": (["absl_status", "absl_statusor", "absl_strings", "absl_str_format", "absl_synchronization", "absl_time"], []),
    # cpprestsdk ships no pkg-config file on Debian 12.
    "cpprest": ([], ["-lcpprest", "-lssl", "-lcrypto", "-lpthread"]),
    "json": ([], []),  # nlohmann-json3-dev: header only
}

def _pkg_config(ctx, args):
    res = ctx.execute(["pkg-config"] + args)
    if res.return_code != 0:
        fail("pkg-config %s failed (run `make deps`): %s" % (" ".join(args), res.stderr))
    return [f for f in res.stdout.strip().split(" ") if f]

def _system_libraries_impl(ctx):
    build = ['package(default_visibility = ["//visibility:public"])', ""]
    for name, (modules, extra) in _LIBS.items():
        defines = []
        linkopts = []
        if modules:
            # Only -D flags need to travel (as `defines`, which propagate). Include
            # directories below /usr/include are reached by path instead, e.g.
            # <eigen3/Eigen/Dense>, because copts do not propagate to dependants.
            defines = [f[2:] for f in _pkg_config(ctx, ["--cflags"] + modules) if f.startswith("-D")]
            linkopts = _pkg_config(ctx, ["--libs"] + modules)
        linkopts = linkopts + extra
        build.append("cc_library(name = %r, defines = %r, linkopts = %r)" % (name, defines, linkopts))
    ctx.file("BUILD", "\n".join(build) + "\n")
    ctx.file("WORKSPACE", 'workspace(name = "%s")\n' % ctx.name)

system_libraries = repository_rule(
    implementation = _system_libraries_impl,
    local = True,
    environ = ["PKG_CONFIG_PATH"],
)

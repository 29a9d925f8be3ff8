#!/bin/sh
# The Node.js command jsii starts for this project's Python (aws-cdk-lib, cdk8s): node itself with
# two V8 flags, set as JSII_NODE by platform_config/runtime.py unless JSII_NODE is already set.
#
# --single-threaded  no background threads: concurrent compilation and GC helper threads burned
#                    about as much CPU again as the synthesis itself, which on a shared 2-core
#                    machine slowed the synthesis down instead of speeding it up;
# --liftoff-only     WebAssembly with V8's baseline compiler only: the CloudFormation validation
#                    that aws-cdk-lib runs at every synth is an 8.5 MB wasm module, and optimizing it
#                    (TurboFan) cost more CPU than one run of it saves.
# Measured in docs/ci-and-tests.md, "Synthesis speed"; the templates are the same byte for byte.
exec node --single-threaded --liftoff-only "$@"

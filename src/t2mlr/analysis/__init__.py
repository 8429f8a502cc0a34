"""The paper's analyses (`t2mlr analyze`), the report writer and figures every experiment shares, and the
timing helpers of benchmarks/. Modules load their heavy dependencies themselves: import what you use."""

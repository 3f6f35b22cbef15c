//! How to declare a kernel of your own.

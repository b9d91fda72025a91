//! xvs-vm-tests: end-to-end tests of xvs on network-namespace topologies
//! (addresses only from 198.18.0.0/15) and the VM recipes.

"""A Flower app that trains with FedSteer (fedsteer_lib.flower) on Fashion-MNIST."""

"""The pykka actors around the cores: `ProducerController`, `ConsumerController`,
`WorkPullingProducerController`."""

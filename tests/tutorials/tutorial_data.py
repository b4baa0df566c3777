"""What the tutorial ports share: stand-ins for the datasets the tutorials download, and
the same starting weights for a jitgrad and a torch model.

The tutorials' datasets (FashionMNIST, CIFAR10, MNIST) are replaced by synthetic images of
the same shapes and types: a class's images share a pattern plus noise, so a few steps
of training lower the loss. A model's random initialisation differs between the libraries
(different generators), so after a tutorial builds its model, `seed_params` gives both
models the same weights."""
import numpy as np


def image_arrays(n, shape, seed, classes=10):
    """n float32 images in [0, 1] of `shape` and their int64 labels."""
    r = np.random.default_rng(seed)
    labels = r.integers(0, classes, n)
    patterns = np.random.default_rng(1000).random((classes,) + shape)
    images = np.clip(0.6 * patterns[labels] + 0.4 * r.random((n,) + shape), 0, 1).astype(np.float32)
    return images, labels


def to_tensor(T):
    """torchvision's ToTensor for an HxW (gray) or HxWxC array in [0, 1]: a CxHxW float32 tensor."""
    def convert(img):
        arr = img[None] if img.ndim == 2 else img.transpose(2, 0, 1)
        return T.tensor(np.ascontiguousarray(arr))
    return convert


def vision_dataset(T, n, shape, seed, transform=None, target_transform=None):
    """A torchvision-style dataset: item i is (transform(image), target_transform(label)),
    the label a Python int as torchvision gives it."""
    images, labels = image_arrays(n, shape, seed)

    class VisionDataset(T.utils.data.Dataset):
        def __init__(self):
            self.transform, self.target_transform = transform, target_transform

        def __len__(self):
            return len(labels)

        def __getitem__(self, idx):
            img, label = images[idx], int(labels[idx])
            if self.transform:
                img = self.transform(img)
            if self.target_transform:
                label = self.target_transform(label)
            return img, label
    return VisionDataset()


def fashion_mnist(T, train=True, transform=None, target_transform=None):
    return vision_dataset(T, 64 if train else 32, (28, 28), 0 if train else 1, transform, target_transform)


def cifar10(T, train=True, transform=None):
    return vision_dataset(T, 40 if train else 20, (32, 32, 3), 2 if train else 3, transform)


def seed_params(T, model, seed=0):
    """Overwrite model's parameters, in order, with seeded uniform values scaled like
    PyTorch's default init (1 / sqrt(fan_in)). Returns the model."""
    r = np.random.default_rng(seed)
    with T.no_grad():
        for p in model.parameters():
            shape = tuple(p.shape)
            fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else max(shape[0] if shape else 1, 1)
            arr = r.uniform(-1, 1, shape) / np.sqrt(fan_in)
            p.copy_(T.tensor(arr, dtype=p.dtype))
    return model

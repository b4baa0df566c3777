"""pytorch/tutorials, beginner_source/data_loading_tutorial.py (Writing Custom Datasets,
DataLoaders and Transforms) ported as a test: a face-landmarks Dataset whose samples are
dicts of numpy arrays, callable transforms (Rescale, RandomCrop drawing from numpy's global
generator, ToTensor through from_numpy of a transposed array) composed, and a shuffled
DataLoader with workers batching the dicts. The images and landmark table are synthetic
(the tutorial downloads them); skimage's resize is a nearest-neighbour resize here."""
import os

import numpy as np
import pytest
from conftest import both

torch = pytest.importorskip("torch")

FRAMES = [(f"face{i}.jpg", np.random.default_rng(i).uniform(0, 60, 2 * 5)) for i in range(10)]
IMAGES = {name: np.random.default_rng(100 + i).random((70 + 3 * i, 60 + 2 * i, 3)) for i, (name, _) in
          enumerate(FRAMES)}


def resize(image, shape):
    rows = (np.arange(shape[0]) * image.shape[0] / shape[0]).astype(int)
    cols = (np.arange(shape[1]) * image.shape[1] / shape[1]).astype(int)
    return image[rows][:, cols]


class Compose:
    def __init__(self, transforms):
        self.transforms = transforms

    def __call__(self, sample):
        for t in self.transforms:
            sample = t(sample)
        return sample


class Rescale:
    def __init__(self, output_size):
        assert isinstance(output_size, (int, tuple))
        self.output_size = output_size

    def __call__(self, sample):
        image, landmarks = sample["image"], sample["landmarks"]
        h, w = image.shape[:2]
        if isinstance(self.output_size, int):
            if h > w:
                new_h, new_w = self.output_size * h / w, self.output_size
            else:
                new_h, new_w = self.output_size, self.output_size * w / h
        else:
            new_h, new_w = self.output_size
        new_h, new_w = int(new_h), int(new_w)
        img = resize(image, (new_h, new_w))
        landmarks = landmarks * [new_w / w, new_h / h]
        return {"image": img, "landmarks": landmarks}


class RandomCrop:
    def __init__(self, output_size):
        self.output_size = (output_size, output_size) if isinstance(output_size, int) else output_size

    def __call__(self, sample):
        image, landmarks = sample["image"], sample["landmarks"]
        h, w = image.shape[:2]
        new_h, new_w = self.output_size
        top = np.random.randint(0, h - new_h)
        left = np.random.randint(0, w - new_w)
        image = image[top: top + new_h, left: left + new_w]
        landmarks = landmarks - [left, top]
        return {"image": image, "landmarks": landmarks}


def test_data_loading_tutorial():
    def run(T):
        class ToTensor:
            def __call__(self, sample):
                image, landmarks = sample["image"], sample["landmarks"]
                image = image.transpose((2, 0, 1))
                return {"image": T.from_numpy(image), "landmarks": T.from_numpy(landmarks)}

        class FaceLandmarksDataset(T.utils.data.Dataset):
            def __init__(self, csv_file, root_dir, transform=None):
                self.landmarks_frame = csv_file
                self.root_dir = root_dir
                self.transform = transform

            def __len__(self):
                return len(self.landmarks_frame)

            def __getitem__(self, idx):
                if T.is_tensor(idx):
                    idx = idx.tolist()
                img_name = os.path.join(self.root_dir, self.landmarks_frame[idx][0])
                image = IMAGES[os.path.basename(img_name)]
                landmarks = np.array([self.landmarks_frame[idx][1]])
                landmarks = landmarks.astype("float").reshape(-1, 2)
                sample = {"image": image, "landmarks": landmarks}
                if self.transform:
                    sample = self.transform(sample)
                return sample

        np.random.seed(0)   # RandomCrop draws from numpy's global generator: the same crops for both
        face_dataset = FaceLandmarksDataset(FRAMES, "data/faces/")
        sizes = [(face_dataset[i]["image"].shape, face_dataset[i]["landmarks"].shape) for i in range(4)]
        transformed_dataset = FaceLandmarksDataset(FRAMES, "data/faces/",
                                                   transform=Compose([Rescale(40), RandomCrop(32), ToTensor()]))
        first = [(tuple(transformed_dataset[i]["image"].size()), tuple(transformed_dataset[i]["landmarks"].size()))
                 for i in range(4)]
        # the tutorial's num_workers=4: jitgrad loads in the main process, so its crops come from the
        # main process's numpy stream, as torch's with num_workers=0 (torch's workers reseed numpy)
        dataloader = T.utils.data.DataLoader(transformed_dataset, batch_size=4, shuffle=True,
                                             num_workers=4 if T is not torch else 0,
                                             generator=T.Generator().manual_seed(0))
        batches = []
        for i_batch, sample_batched in enumerate(dataloader):
            batches.append((sorted(sample_batched), sample_batched["image"], sample_batched["landmarks"]))
            if i_batch == 3:
                break
        return sizes, first, batches
    both(run)
